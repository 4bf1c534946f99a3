//! burst-bench: perftest's tests over burst, next to kernel TCP and the raw
//! UDP path, with perftest's vocabulary and output.
//!
//! With no arguments it runs burst's main job on an embedded default: two
//! endpoints on loopback (127.0.90.1 and 127.0.90.2, UDP 4791 each), RDMA
//! WRITE bandwidth with 64 KiB messages and 64-byte SEND latency, each next
//! to kernel TCP and to the raw UDP path (the same frames through the same
//! port code, no RDMA stack) measured in the same run.
//!
//! ```text
//! burst-bench                                   # the main job (loopback)
//! burst-bench write_bw -s 65536 -D 5            # one test, both ends in this process
//! burst-bench send_lat --transport tcp -s 64    # the same over kernel TCP
//! burst-bench read_bw --server --local 198.18.0.101          # server role
//! burst-bench read_bw --local 198.18.0.102 198.18.0.101      # client role
//! burst-bench kv --tokens 4096 --verify         # KV-cache transfer, burst vs TCP
//! burst-bench idle --secs 10                    # CPU of two idle engines
//! ```

mod idle;
mod kv;
mod rawudp;
mod rdma;
mod report;
mod tcp;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use burst_verbs::Mtu;
use clap::{Parser, ValueEnum};

use report::{Bw, Format, Lat};

/// perftest's tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[clap(rename_all = "snake_case")]
pub enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA WRITE ping-pong latency (the receiver polls memory).
    WriteLat,
    /// RDMA READ bandwidth.
    ReadBw,
    /// RDMA READ latency (whole round trip).
    ReadLat,
    /// SEND/RECV bandwidth.
    SendBw,
    /// SEND/RECV ping-pong latency.
    SendLat,
    /// Atomic (fetch-and-add, compare-and-swap alternating) bandwidth.
    AtomicBw,
    /// Atomic latency (whole round trip).
    AtomicLat,
}

impl Test {
    /// perftest's name.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::WriteLat => "write_lat",
            Test::ReadBw => "read_bw",
            Test::ReadLat => "read_lat",
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
            Test::AtomicBw => "atomic_bw",
            Test::AtomicLat => "atomic_lat",
        }
    }
    fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }
    fn from_name(s: &str) -> Option<Test> {
        Test::value_variants()
            .iter()
            .copied()
            .find(|t| t.name() == s)
    }
}

/// What carries the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// RDMA over burst (RoCEv2 on UDP 4791).
    Burst,
    /// Kernel TCP: a stream for bandwidth, busy-polled request/response for latency.
    Tcp,
    /// The raw UDP port: burst's packet path without the RDMA stack (the ceiling).
    RawUdp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Burst => "burst",
            Transport::Tcp => "tcp",
            Transport::RawUdp => "raw-udp",
        }
    }
    fn from_name(s: &str) -> Option<Transport> {
        Transport::value_variants()
            .iter()
            .copied()
            .find(|t| t.name() == s)
    }
}

/// perftest-style benchmarks of burst, with kernel TCP and the raw UDP
/// path alongside.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Cli {
    /// The test; none runs the main job (write_bw 64 KiB and send_lat 64 B,
    /// burst vs TCP vs raw UDP, on loopback).
    #[arg(value_enum)]
    test: Option<Test>,
    /// The server's address (client role). Without it and without
    /// --server, both ends run in this process on loopback.
    peer: Option<IpAddr>,
    /// Serve tests to a client (server role).
    #[arg(long)]
    server: bool,
    /// What carries the messages.
    #[arg(long, value_enum, default_value_t = Transport::Burst)]
    transport: Transport,
    /// Message size in bytes.
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Iterations (messages per QP).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// Sweep message sizes from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long)]
    all: bool,
    /// Queue pairs.
    #[arg(short = 'q', long, default_value_t = 1)]
    qps: usize,
    /// Path MTU (256..4096).
    #[arg(short = 'm', long, default_value_t = 4096)]
    mtu: usize,
    /// Both directions at once (bandwidth tests).
    #[arg(short = 'b', long)]
    bidirectional: bool,
    /// Send messages up to this size inline.
    #[arg(short = 'I', long, default_value_t = 0)]
    inline: u32,
    /// Work requests in flight per QP (bandwidth tests).
    #[arg(short = 't', long, default_value_t = 128)]
    tx_depth: u32,
    /// Event-driven instead of busy polling: burst sleeps on a completion
    /// channel; TCP uses blocking sockets; raw UDP blocks in poll(2).
    #[arg(short = 'e', long)]
    events: bool,
    /// Offer no selective repeat: burst's QPs recover from loss by going
    /// back N, as toward RXE or an RNIC (by default two burst peers agree
    /// on selective repeat through the exchange of QP details).
    #[arg(long)]
    go_back_n: bool,
    /// This side's address.
    #[arg(long)]
    local: Option<IpAddr>,
    /// The out-of-band TCP port (the server tells the TCP test's port).
    #[arg(short = 'p', long, default_value_t = 18517)]
    port: u16,
    /// One JSON object per result.
    #[arg(long)]
    json: bool,
    /// The out-of-band TCP address, when the RDMA addresses are not the
    /// host's (a DPDK port owns its address): the server listens on it,
    /// the client connects to it.
    #[arg(long)]
    oob: Option<IpAddr>,
}

const LOOP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 90, 1));
const LOOP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 90, 2));

/// One run's parameters, as the client sends them to the server.
#[derive(Debug, Clone, Copy)]
struct Run {
    test: Test,
    transport: Transport,
    p: rdma::Params,
    bidir: bool,
}

impl Run {
    fn encode(&self) -> String {
        let p = &self.p;
        format!(
            "HELLO {} {} {} {} {} {} {} {} {} {} {}",
            self.test.name(),
            self.transport.name(),
            p.size,
            p.iters,
            p.duration.map_or(0, |d| d.as_millis() as u64),
            p.qps,
            p.mtu.bytes(),
            p.tx_depth,
            p.inline,
            u8::from(self.bidir),
            u8::from(p.events)
        )
    }
    fn decode(l: &str) -> Option<Run> {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() != 12 || f[0] != "HELLO" {
            return None;
        }
        let ms: u64 = f[5].parse().ok()?;
        Some(Run {
            test: Test::from_name(f[1])?,
            transport: Transport::from_name(f[2])?,
            p: rdma::Params {
                size: f[3].parse().ok()?,
                iters: f[4].parse().ok()?,
                duration: (ms > 0).then(|| Duration::from_millis(ms)),
                qps: f[6].parse().ok()?,
                mtu: Mtu::from_bytes(f[7].parse().ok()?)?,
                tx_depth: f[8].parse().ok()?,
                inline: f[9].parse().ok()?,
                events: f[11] == "1",
                // The client's offer decides (both must offer it).
                offer_sr: true,
            },
            bidir: f[10] == "1",
        })
    }
}

/// A result line of either kind.
enum Line {
    Bw(Bw),
    Lat(Lat),
}

struct Oob {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Oob {
    fn new(s: TcpStream) -> Result<Oob, String> {
        let w = s.try_clone().map_err(|e| e.to_string())?;
        Ok(Oob {
            r: BufReader::new(s),
            w,
        })
    }
    fn send(&mut self, l: &str) -> Result<(), String> {
        writeln!(self.w, "{l}").map_err(|e| format!("out-of-band write: {e}"))
    }
    fn recv(&mut self) -> Result<String, String> {
        let mut l = String::new();
        let n = self
            .r
            .read_line(&mut l)
            .map_err(|e| format!("out-of-band read: {e}"))?;
        if n == 0 {
            return Err("the peer closed the out-of-band connection".into());
        }
        Ok(l.trim_end().to_string())
    }
}

fn infos_line(v: &[rdma::Info]) -> String {
    let mut s = String::from("INFO");
    for i in v {
        s.push(' ');
        s.push_str(&i.encode());
    }
    s
}

fn parse_infos(l: &str) -> Result<Vec<rdma::Info>, String> {
    let mut it = l.split_whitespace();
    if it.next() != Some("INFO") {
        return Err(format!("expected INFO, got {l:?}"));
    }
    it.map(|x| rdma::Info::decode(x).ok_or(format!("bad QP info {x:?}")))
        .collect()
}

/// The server's side of the out-of-band link for one run: its final
/// `COUNT` line also carries the CPU time the server used and its PID (in
/// loopback mode both roles share a process, whose CPU time the client
/// already measures).
struct CpuReply<'a> {
    o: &'a mut Oob,
    cpu0: f64,
}

impl CpuReply<'_> {
    fn send(&mut self, line: &str) -> Result<(), String> {
        if line.starts_with("COUNT ") {
            let cpu = report::cpu_now() - self.cpu0;
            return self
                .o
                .send(&format!("{line} CPU {cpu:.6} PID {}", std::process::id()));
        }
        self.o.send(line)
    }
    fn recv(&mut self) -> Result<String, String> {
        self.o.recv()
    }
}

/// The server's CPU seconds from its final line, unless it runs in this
/// process (then the client's own figure already includes it).
fn server_cpu(count_line: &str) -> f64 {
    let f: Vec<&str> = count_line.split_whitespace().collect();
    let field = |k: &str| f.iter().position(|x| *x == k).and_then(|i| f.get(i + 1));
    let same = field("PID").and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    if same {
        return 0.0;
    }
    field("CPU").and_then(|c| c.parse().ok()).unwrap_or(0.0)
}

/// The number after `key` in the server's `COUNT` line.
fn count_field(line: &str, key: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    f.position(|x| x == key)?;
    f.next()?.parse().ok()
}

/// The count at the start of a `COUNT n ...` line.
fn count_of(line: &str) -> &str {
    line.trim_start_matches("COUNT ")
        .split_whitespace()
        .next()
        .unwrap_or("0")
}

/// The server's part of one run.
fn serve_run(o: &mut Oob, run: &Run, local: IpAddr) -> Result<(), String> {
    let cpu0 = report::cpu_now();
    let mut o = CpuReply { o, cpu0 };
    let o = &mut o;
    let stop = Arc::new(AtomicBool::new(false));
    match run.transport {
        Transport::Burst => {
            let side = rdma::Side::open(local, &run.p, 0x10_0000)?;
            let peer = parse_infos(&o.recv()?)?;
            o.send(&infos_line(&side.infos()))?;
            side.connect(&peer, run.p.mtu)?;
            let dropped = || side.ctx.counters().map_or(0, |c| c.port.rx_dropped);
            let dropped0 = dropped();
            o.send("READY")?;
            // The client's DONE ends the run; our role runs until then.
            let test = run.test;
            let bidir = run.bidir;
            let p = run.p;
            let result = std::thread::scope(|sc| -> Result<String, String> {
                let h = sc.spawn(|| -> Result<String, String> {
                    if bidir && test.is_bw() && test != Test::SendBw {
                        let b = rdma::bw(test, &side, &peer, &p, "server")?;
                        while !stop.load(Ordering::Acquire) {
                            side.ctx.progress();
                        }
                        return Ok(format!("{}", b.iters));
                    }
                    match test {
                        Test::SendBw => rdma::sink(&side, &p, &stop).map(|n| n.to_string()),
                        Test::SendLat | Test::WriteLat => {
                            rdma::pong(test, &side, &peer, &p, &stop).map(|_| "0".into())
                        }
                        _ => {
                            rdma::idle(&side, &stop);
                            Ok("0".into())
                        }
                    }
                });
                let done = o.recv();
                stop.store(true, Ordering::Release);
                let r = h.join().map_err(|_| "server role panicked".to_string())?;
                done?;
                r
            });
            let result = match result.and_then(|r| side.verify(test, &peer, &p, true).map(|()| r)) {
                Ok(r) => r,
                Err(e) => {
                    o.send(&format!("FAILED {e}"))?;
                    return Err(e);
                }
            };
            let drops = dropped().saturating_sub(dropped0);
            o.send(&format!("COUNT {result} DROPS {drops}"))
        }
        Transport::Tcp => {
            let l = TcpListener::bind((local, 0)).map_err(|e| format!("tcp bind: {e}"))?;
            let data_port = l.local_addr().map_err(|e| e.to_string())?.port();
            o.send(&format!("READY {data_port}"))?;
            if run.test.is_bw() {
                tcp::stream_sink(l)?;
            } else {
                tcp::echo(l, run.p.size, run.p.events)?;
            }
            o.recv()?;
            o.send("COUNT 0")
        }
        Transport::RawUdp => {
            let (port_, _) = rawudp::open(local)?;
            let got = Arc::new(rawudp::SinkCount::default());
            let (st, g) = (Arc::clone(&stop), Arc::clone(&got));
            let (bw, events) = (run.test.is_bw(), run.p.events);
            let h = std::thread::spawn(move || {
                if bw {
                    rawudp::sink(port_, &st, &g);
                    Ok(())
                } else {
                    rawudp::echo(port_, &st, events)
                }
            });
            o.send("READY")?;
            let done = o.recv();
            stop.store(true, Ordering::Release);
            h.join()
                .map_err(|_| "raw-udp role panicked".to_string())??;
            done?;
            // The receiver's own clock: from its first datagram to its last.
            let span = got.span_ns.load(Ordering::Relaxed) as f64 / 1e9;
            o.send(&format!(
                "COUNT {} SPAN {span:.9}",
                got.bytes.load(Ordering::Relaxed)
            ))
        }
    }
}

/// Serves runs on one out-of-band connection until the client says BYE.
fn serve(l: TcpListener, local: IpAddr) -> Result<(), String> {
    let (s, _) = l.accept().map_err(|e| format!("out-of-band accept: {e}"))?;
    let mut o = Oob::new(s)?;
    loop {
        let line = o.recv()?;
        if line == "BYE" {
            return Ok(());
        }
        let run = Run::decode(&line).ok_or(format!("bad request {line:?}"))?;
        serve_run(&mut o, &run, local)?;
    }
}

/// The client's part of one run.
fn client_run(o: &mut Oob, run: &Run, local: IpAddr, server: IpAddr) -> Result<Line, String> {
    let cpu0 = report::cpu_now();
    let wall = std::time::Instant::now();
    let mut line = client_run_inner(o, run, local, server)?;
    let (secs, server_cpu) = (wall.elapsed().as_secs_f64(), line.1);
    let mine = report::cpu_now() - cpu0;
    let cpu = mine + server_cpu;
    match &mut line.0 {
        Line::Bw(b) => {
            b.cpu_secs = cpu * b.secs / secs.max(1e-9);
            b.client_cpu_secs = mine * b.secs / secs.max(1e-9);
            per_packet(b, run.p.mtu.bytes());
        }
        Line::Lat(l) => {
            l.secs = secs;
            l.cpu_secs = cpu;
        }
    }
    Ok(line.0)
}

/// Fills in [`report::Bw::ns_per_pkt`] and [`report::Bw::cores_at_400g`]
/// from the run's CPU seconds, for packets of `mtu` payload bytes.
fn per_packet(b: &mut report::Bw, mtu: usize) {
    let pkts = b.iters as f64 * b.bytes.div_ceil(mtu.max(1)).max(1) as f64;
    let gb = b.iters as f64 * b.bytes as f64 / 1e9;
    if pkts == 0.0 || gb == 0.0 {
        return;
    }
    let sides = [b.client_cpu_secs, (b.cpu_secs - b.client_cpu_secs).max(0.0)];
    b.ns_per_pkt = sides.map(|s| s * 1e9 / pkts);
    // 400 Gb/s of payload is 50 GB/s.
    b.cores_at_400g = sides.map(|s| s / gb * 50.0);
}

/// [`client_run`] without the CPU accounting; also returns the server's
/// CPU seconds.
fn client_run_inner(
    o: &mut Oob,
    run: &Run,
    local: IpAddr,
    server: IpAddr,
) -> Result<(Line, f64), String> {
    o.send(&run.encode())?;
    let p = run.p;
    match run.transport {
        Transport::Burst => {
            let side = rdma::Side::open(local, &p, 0x20_0000)?;
            o.send(&infos_line(&side.infos()))?;
            let peer = parse_infos(&o.recv()?)?;
            side.connect(&peer, p.mtu)?;
            let ready = o.recv()?;
            if ready != "READY" {
                return Err(format!("server: {ready}"));
            }
            let r = if run.test.is_bw() {
                rdma::bw(run.test, &side, &peer, &p, run.test.name()).map(Line::Bw)
            } else {
                rdma::lat(run.test, &side, &peer, &p).map(Line::Lat)
            };
            o.send("DONE")?;
            let count = o.recv()?;
            if let Some(e) = count.strip_prefix("FAILED ") {
                return Err(format!("server: {e}"));
            }
            let mut line = r?;
            side.verify(run.test, &peer, &p, false)?;
            if let Line::Bw(b) = &mut line {
                b.rx_dropped[1] = count_field(&count, "DROPS").unwrap_or(0);
            }
            if let (Line::Bw(b), true) = (&mut line, run.bidir) {
                // The server's direction, measured over the same time.
                let n: u64 = count_of(&count).parse().unwrap_or(0);
                if run.test != Test::SendBw {
                    b.iters += n;
                    b.gbps = b.iters as f64 * b.bytes as f64 * 8.0 / b.secs / 1e9;
                    b.mpps = b.iters as f64 / b.secs / 1e6;
                }
            }
            Ok((line, server_cpu(&count)))
        }
        Transport::Tcp => {
            let ready = o.recv()?;
            let data_port: u16 = ready
                .strip_prefix("READY ")
                .and_then(|p| p.parse().ok())
                .ok_or(format!("server: {ready}"))?;
            let to = SocketAddr::new(server, data_port);
            let r = if run.test.is_bw() {
                tcp::stream(to, p.size, p.iters, p.duration).map(Line::Bw)
            } else {
                tcp::pingpong(to, p.size, p.iters, p.duration, p.events).map(Line::Lat)
            };
            o.send("DONE")?;
            let count = o.recv()?;
            r.map(|l| (l, server_cpu(&count)))
        }
        Transport::RawUdp => {
            let (mut udp, name) = rawudp::open(local)?;
            if o.recv()? != "READY" {
                return Err("server not ready".into());
            }
            let to = SocketAddr::new(server, burst_verbs::ROCEV2_PORT);
            if run.test.is_bw() {
                let (mut b, sent) = rawudp::stream(
                    &mut *udp,
                    &name,
                    to,
                    p.size,
                    p.mtu.bytes(),
                    p.iters,
                    p.duration,
                )?;
                // Until the last datagram is in (or stops coming): the
                // receiver's clock ends the window, not a sleep here.
                std::thread::sleep(Duration::from_millis(50));
                o.send("DONE")?;
                let c = o.recv()?;
                let bytes: f64 = count_of(&c).parse().unwrap_or(0.0);
                let f: Vec<&str> = c.split_whitespace().collect();
                let span = f
                    .iter()
                    .position(|x| *x == "SPAN")
                    .and_then(|i| f.get(i + 1))
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|&v| v > 0.0)
                    .unwrap_or(b.secs);
                b.iters = (bytes / p.size as f64) as u64;
                b.secs = span;
                b.gbps = bytes * 8.0 / span / 1e9;
                b.mpps = bytes / p.size as f64 / span / 1e6;
                let lost = 1.0 - bytes / (sent as f64).max(1.0);
                if lost > 0.01 {
                    eprintln!(
                        "burst-bench: raw UDP lost {:.1}% of its datagrams: the ceiling counts only what arrived",
                        lost * 100.0
                    );
                }
                Ok((Line::Bw(b), server_cpu(&c)))
            } else {
                let r =
                    rawudp::pingpong(&mut *udp, &name, to, p.size, p.iters, p.duration, p.events);
                o.send("DONE")?;
                let c = o.recv()?;
                r.map(|l| (Line::Lat(l), server_cpu(&c)))
            }
        }
    }
}

fn title(test: Test, t: Transport, p: &rdma::Params) -> String {
    format!(
        "{} over {} (RC, MTU {}, {} QP{}, tx depth {})",
        test.name(),
        t.name(),
        p.mtu.bytes(),
        p.qps,
        if p.qps == 1 { "" } else { "s" },
        p.tx_depth
    )
}

fn params(cli: &Cli, test: Test, size: usize) -> Result<rdma::Params, String> {
    Ok(rdma::Params {
        size,
        iters: cli.iters.unwrap_or(match (test.is_bw(), cli.all) {
            (true, true) => 100,
            (true, false) => 5000,
            (false, true) => 1000,
            (false, false) => 20000,
        }),
        duration: cli.duration.map(Duration::from_secs_f64),
        qps: cli.qps.max(1),
        tx_depth: cli.tx_depth.max(1),
        mtu: Mtu::from_bytes(cli.mtu).ok_or(format!("MTU {} is not one of 256..4096", cli.mtu))?,
        inline: cli.inline,
        events: cli.events,
        offer_sr: !cli.go_back_n,
    })
}

/// The client (or loopback) side: runs each size, prints each line.
fn drive(
    cli: &Cli,
    test: Test,
    transport: Transport,
    oob: &mut Oob,
    local: IpAddr,
    server: IpAddr,
    fmt: Format,
) -> Result<Vec<Line>, String> {
    let sizes: Vec<usize> = if cli.all {
        (1..=23).map(|k| 1usize << k).collect()
    } else {
        vec![cli.size.unwrap_or(if test.is_bw() { 65536 } else { 2 })]
    };
    let p0 = params(cli, test, sizes[0])?;
    if test.is_bw() {
        report::bw_header(fmt, &title(test, transport, &p0));
    } else {
        report::lat_header(fmt, &title(test, transport, &p0));
    }
    let mut out = Vec::new();
    for s in sizes {
        let run = Run {
            test,
            transport,
            p: params(cli, test, s)?,
            bidir: cli.bidirectional,
        };
        let line = client_run(oob, &run, local, server)?;
        match &line {
            Line::Bw(b) => report::bw_line(fmt, b),
            Line::Lat(l) => report::lat_line(fmt, l),
        }
        out.push(line);
    }
    report::end(fmt);
    Ok(out)
}

/// Loopback: a server thread on LOOP_B, this thread the client on LOOP_A.
fn loopback<T>(f: impl FnOnce(&mut Oob) -> Result<T, String>) -> Result<T, String> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let local_b = LOOP_B;
    let server = std::thread::spawn(move || serve(l, local_b));
    let mut o = Oob::new(TcpStream::connect(addr).map_err(|e| e.to_string())?)?;
    let r = f(&mut o);
    let _ = o.send("BYE");
    let s = server
        .join()
        .map_err(|_| "server thread panicked".to_string())?;
    match (r, s) {
        (Ok(r), Ok(())) => Ok(r),
        // The server's error is the cause when the client only saw it leave.
        (Err(c), Err(s)) => Err(format!("{c}; server: {s}")),
        (Err(c), Ok(())) => Err(c),
        (Ok(_), Err(s)) => Err(format!("server: {s}")),
    }
}

/// The main job: WRITE bandwidth and SEND latency, burst vs raw UDP vs TCP.
fn main_job(cli: &Cli, fmt: Format) -> Result<(), String> {
    if fmt == Format::Text {
        println!("burst-bench: two endpoints on {LOOP_A} and {LOOP_B} (burst: RoCEv2 on UDP 4791), in one process; the same messages over the raw UDP port and kernel TCP in the same run");
    }
    loopback(|o| {
        let mut bw = Vec::new();
        let mut lat = Vec::new();
        for t in [Transport::Burst, Transport::RawUdp, Transport::Tcp] {
            let mut c = cli.clone();
            c.size = Some(cli.size.unwrap_or(65536));
            for l in drive(&c, Test::WriteBw, t, o, LOOP_A, LOOP_B, fmt)? {
                if let Line::Bw(b) = l {
                    bw.push(b);
                }
            }
        }
        for t in [Transport::Burst, Transport::RawUdp, Transport::Tcp] {
            let mut c = cli.clone();
            c.size = Some(64);
            for l in drive(&c, Test::SendLat, t, o, LOOP_A, LOOP_B, fmt)? {
                if let Line::Lat(x) = l {
                    lat.push(x);
                }
            }
        }
        if fmt == Format::Text && bw.len() == 3 && lat.len() == 3 {
            println!(
                " burst / raw UDP ceiling: bandwidth {:.2}, latency p50 {:.2}",
                bw[0].gbps / bw[1].gbps,
                lat[0].p50 / lat[1].p50
            );
            println!(
                " burst / kernel TCP:      bandwidth {:.2}, latency p50 {:.2} (TCP busy-polled)",
                bw[0].gbps / bw[2].gbps,
                lat[0].p50 / lat[2].p50
            );
        }
        Ok(())
    })
}

fn run(cli: &Cli) -> Result<(), String> {
    let fmt = if cli.json { Format::Json } else { Format::Text };
    let Some(test) = cli.test else {
        if cli.server || cli.peer.is_some() {
            return Err("name a test for the server and client roles".into());
        }
        return main_job(cli, fmt);
    };
    if cli.bidirectional && !matches!(test, Test::WriteBw | Test::ReadBw | Test::AtomicBw) {
        return Err("-b is implemented for write_bw, read_bw and atomic_bw".into());
    }
    if cli.transport != Transport::Burst && !matches!(test, Test::WriteBw | Test::SendLat) {
        return Err(format!(
            "--transport {} measures a stream (use write_bw) or a request/response (use send_lat)",
            cli.transport.name()
        ));
    }
    if cli.server {
        let local = cli.local.ok_or("--server needs --local ADDR")?;
        let at = cli.oob.unwrap_or(local);
        let l = TcpListener::bind((at, cli.port))
            .map_err(|e| format!("bind {at}:{}: {e}", cli.port))?;
        return serve(l, local);
    }
    if let Some(peer) = cli.peer {
        let local = cli.local.ok_or("the client needs --local ADDR")?;
        let at = cli.oob.unwrap_or(peer);
        let s = TcpStream::connect((at, cli.port))
            .map_err(|e| format!("connect {at}:{}: {e}", cli.port))?;
        let mut o = Oob::new(s)?;
        let r = drive(cli, test, cli.transport, &mut o, local, peer, fmt);
        let _ = o.send("BYE");
        return r.map(|_| ());
    }
    loopback(|o| drive(cli, test, cli.transport, o, LOOP_A, LOOP_B, fmt).map(|_| ()))
}

fn main() -> std::process::ExitCode {
    type Sub = fn(Box<dyn Iterator<Item = String>>) -> Result<(), String>;
    let subs: [(&str, Sub); 2] = [("kv", |a| kv::main(a)), ("idle", |a| idle::main(a))];
    let first = std::env::args().nth(1);
    if let Some((name, sub)) = subs.iter().find(|(n, _)| first.as_deref() == Some(*n)) {
        let args = std::env::args()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, a)| a);
        return match sub(Box::new(args)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("burst-bench {name}: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("burst-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_packet_splits_the_sides_and_scales_to_400g() {
        let mut b = report::Bw {
            test: "write_bw".into(),
            transport: "burst".into(),
            bytes: 65536,
            iters: 1000,
            gbps: 0.0,
            mpps: 0.0,
            secs: 1.0,
            retransmitted_pkts: 0,
            retransmits_started: 0,
            ack_timeouts: 0,
            sr_probes: 0,
            sr_go_backs: 0,
            window_cuts: 0,
            rx_dropped: [0; 2],
            cpu_secs: 2.0,
            client_cpu_secs: 1.2,
            ns_per_pkt: [0.0; 2],
            cores_at_400g: [0.0; 2],
        };
        per_packet(&mut b, 4096);
        // 16 packets a message: 16,000 packets, 65.536 MB.
        assert!((b.ns_per_pkt[0] - 75_000.0).abs() < 1e-6);
        assert!((b.ns_per_pkt[1] - 50_000.0).abs() < 1e-6);
        assert!((b.cores_at_400g[0] - 1.2 / 0.065536 * 50.0).abs() < 1e-9);
        assert!((b.cores_at_400g[1] - 0.8 / 0.065536 * 50.0).abs() < 1e-9);
        // A message shorter than the MTU is one packet.
        b.bytes = 64;
        per_packet(&mut b, 4096);
        assert!((b.ns_per_pkt[0] - 1.2e6).abs() < 1e-3);
    }
}
