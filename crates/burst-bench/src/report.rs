//! Results: perftest-style lines for people, JSON for machines.

use hdrhistogram::Histogram;
use serde::Serialize;

/// One bandwidth result line.
#[derive(Debug, Clone, Serialize)]
pub struct Bw {
    /// Test name (`write_bw`, …).
    pub test: String,
    /// `burst`, `tcp` or `raw-udp`.
    pub transport: String,
    /// Message size.
    pub bytes: usize,
    /// Messages completed (both directions with `-b`).
    pub iters: u64,
    /// Gb/s (10^9 bits per second of payload).
    pub gbps: f64,
    /// Millions of messages per second.
    pub mpps: f64,
    /// Wall time of the measurement, seconds.
    pub secs: f64,
    /// burst only: packets the sender retransmitted and go-back-N rounds it
    /// started (0 for TCP and raw UDP, which do not say).
    pub retransmitted_pkts: u64,
    /// See `retransmitted_pkts`.
    pub retransmits_started: u64,
    /// burst only: the sender's ACK timeouts (each waits the QP's whole
    /// timeout) and selective-repeat probes (a packet resent after four
    /// round trips without progress, instead of a timeout).
    pub ack_timeouts: u64,
    /// See `ack_timeouts`.
    pub sr_probes: u64,
    /// burst only: times a selective-repeat recovery fell back to go-back-N.
    pub sr_go_backs: u64,
    /// burst only: cuts of the sender's congestion window toward its peer
    /// (NAKs, timeouts, CNPs each cut at most once per round trip).
    pub window_cuts: u64,
    /// burst only: frames the client's and the server's ports dropped
    /// below burst during the run (a full socket receive buffer or device
    /// ring: `PortCounters::rx_dropped`), each side's own count.
    pub rx_dropped: [u64; 2],
    /// CPU time both sides used over the run (user + system, getrusage),
    /// seconds: a busy-polling stack shows here what its speed costs.
    pub cpu_secs: f64,
    /// CPU time the client alone used (the sender of write_bw and
    /// send_bw), seconds over the same span as `cpu_secs`.
    pub client_cpu_secs: f64,
    /// CPU time per packet, nanoseconds, of the client and of the server:
    /// their CPU seconds over the messages' data packets (a message of
    /// `bytes` is `bytes / MTU` packets, rounded up; for TCP the same
    /// nominal count, so the figures compare per byte moved).
    pub ns_per_pkt: [f64; 2],
    /// Cores the client and the server would each need at 400 Gb/s of
    /// payload at this cost (CPU seconds per GB x 50 GB/s).
    pub cores_at_400g: [f64; 2],
}

/// One latency result line, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Lat {
    /// Test name.
    pub test: String,
    /// Transport.
    pub transport: String,
    /// Message size.
    pub bytes: usize,
    /// Samples.
    pub iters: u64,
    /// Minimum.
    pub min: f64,
    /// Median ("typical" in perftest).
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Whether the figure is half a round trip (send/write) or a whole
    /// one (read/atomic), as perftest reports them.
    pub half_rtt: bool,
    /// Event-driven (`-e`): burst waits on a completion channel, TCP and
    /// raw UDP block in the kernel; otherwise every side busy-polls.
    pub events: bool,
    /// (quantile, microseconds) points of the distribution, for CDF plots.
    pub cdf: Vec<(f64, f64)>,
    /// Wall time of the run, seconds.
    pub secs: f64,
    /// CPU time both sides used over the run (user + system), seconds.
    pub cpu_secs: f64,
}

/// Whether a run of `iters` messages, or of `duration` when given, goes on
/// after `done` messages since `start` (the rule of every test loop).
pub fn more(
    start: std::time::Instant,
    duration: Option<std::time::Duration>,
    done: u64,
    iters: u64,
) -> bool {
    match duration {
        Some(d) => start.elapsed() < d,
        None => done < iters,
    }
}

/// CPU time this process has used so far (user + system), seconds.
pub fn cpu_now() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a live, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The process's resident set in bytes (`/proc/self/statm`), 0 where it
/// cannot be read.
pub fn rss_now() -> u64 {
    rss_of("self")
}

/// The resident set of process `pid` (`self`: this one) in bytes, 0 where
/// it cannot be read.
pub fn rss_of(pid: &str) -> u64 {
    let pages = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// Latency samples in nanoseconds.
pub struct Samples(Histogram<u64>);

impl Samples {
    /// An empty histogram (1 ns to 100 s, 3 significant digits).
    pub fn new() -> Samples {
        Samples(Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds"))
    }

    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }

    /// The line for this histogram.
    pub fn lat(
        &self,
        test: &str,
        transport: &str,
        bytes: usize,
        half_rtt: bool,
        events: bool,
    ) -> Lat {
        let h = &self.0;
        let us = |ns: u64| ns as f64 / 1000.0;
        Lat {
            test: test.into(),
            transport: transport.into(),
            bytes,
            iters: h.len(),
            min: us(h.min()),
            p50: us(h.value_at_quantile(0.5)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            avg: h.mean() / 1000.0,
            half_rtt,
            events,
            cdf: [
                0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995,
                0.999, 0.9999, 1.0,
            ]
            .iter()
            .map(|&q| (q, us(h.value_at_quantile(q))))
            .collect(),
            secs: 0.0,
            cpu_secs: 0.0,
        }
    }
}

/// How results are printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// perftest's table.
    Text,
    /// One JSON object per line.
    Json,
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The header of a bandwidth table.
pub fn bw_header(f: Format, title: &str) {
    if f == Format::Text {
        println!("{RULE}");
        println!("                    {title}");
        println!(" #bytes     #iterations    BW average[Gb/sec]   MsgRate[Mpps]   CPU[cores]");
    }
}

/// One bandwidth line.
pub fn bw_line(f: Format, b: &Bw) {
    match f {
        Format::Text => println!(
            " {:<10} {:<14} {:<20.2} {:<15.6} {:.2}",
            b.bytes,
            b.iters,
            b.gbps,
            b.mpps,
            b.cpu_secs / b.secs.max(1e-9)
        ),
        Format::Json => println!("{}", serde_json::to_string(b).unwrap_or_default()),
    }
}

/// The header of a latency table.
pub fn lat_header(f: Format, title: &str) {
    if f == Format::Text {
        println!("{RULE}");
        println!("                    {title}");
        println!(" #bytes #iterations    t_min[usec]    t_typical[usec]    t_avg[usec]    99% percentile[usec]   99.9% percentile[usec]   t_max[usec]   CPU[cores]");
    }
}

/// One latency line.
pub fn lat_line(f: Format, l: &Lat) {
    match f {
        Format::Text => println!(
            " {:<6} {:<14} {:<14.2} {:<18.2} {:<14.2} {:<22.2} {:<24.2} {:<13.2} {:.2}",
            l.bytes,
            l.iters,
            l.min,
            l.p50,
            l.avg,
            l.p99,
            l.p999,
            l.max,
            l.cpu_secs / l.secs.max(1e-9)
        ),
        Format::Json => println!("{}", serde_json::to_string(l).unwrap_or_default()),
    }
}

/// The closing rule.
pub fn end(f: Format) {
    if f == Format::Text {
        println!("{RULE}");
    }
}

/// A progress bar on a terminal, nothing otherwise.
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_message(what.to_string());
    pb
}
