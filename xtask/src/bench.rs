//! `cargo xtask bench`: burst next to its path ceiling (the raw UDP port)
//! and kernel TCP over a veth pair between two network namespaces, sender
//! and receiver pinned to separate cores, transports alternated round by
//! round; a JSON record per run and a markdown report with plots.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::dropin::median;
use crate::{cargo, dropin, kvbench, step};

const TRANSPORTS: [&str; 3] = ["burst", "raw-udp", "tcp"];

struct Env {
    bin: PathBuf,
    server_cpu: String,
    client_cpu: String,
}

/// Runs one burst-bench client against a fresh server; returns its JSON lines.
fn run_pair(env: &Env, test: &str, args: &[&str], port: u16) -> Result<Vec<Value>, String> {
    let p = port.to_string();
    let bin = env.bin.to_string_lossy().into_owned();
    let mut server = Command::new("timeout");
    server
        .args([
            "300",
            "ip",
            "netns",
            "exec",
            "burstbb1",
            "taskset",
            "-c",
            &env.server_cpu,
            &bin,
            test,
        ])
        .args(["--server", "--local", "198.18.0.101", "-p", &p]);
    let mut server = listening(server, "burstbb1", port)?;
    let out = Command::new("timeout")
        .args([
            "300",
            "ip",
            "netns",
            "exec",
            "burstbb2",
            "taskset",
            "-c",
            &env.client_cpu,
            &bin,
            test,
        ])
        .args(args)
        .args([
            "--json",
            "--local",
            "198.18.0.102",
            "-p",
            &p,
            "198.18.0.101",
        ])
        .output()
        .map_err(|e| format!("client: {e}"))?;
    let _ = server.wait();
    if !out.status.success() {
        return Err(format!(
            "{test} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Starts `server` (a `timeout ... ip netns exec NS ...` command) and waits
/// until it listens on TCP `port` in `ns`; stopped again if it never does.
pub(crate) fn listening(
    mut server: Command,
    ns: &str,
    port: u16,
) -> Result<std::process::Child, String> {
    let mut child = server
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("server: {e}"))?;
    if !dropin::wait_listen(Some(ns), port, Duration::from_secs(10)) {
        // SIGTERM to `timeout` reaches the server too (SIGKILL would not).
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        return Err("the server never listened".into());
    }
    Ok(child)
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu,
        "kernel": kernel.trim(),
    })
}

fn commit(root: &Path) -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The criterion estimates (ns) found under target/criterion.
fn criterion(root: &Path) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let base = root.join("target/criterion");
    let mut stack = vec![base.clone()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "new") {
                    if let Ok(t) = std::fs::read_to_string(p.join("estimates.json")) {
                        if let Ok(v) = serde_json::from_str::<Value>(&t) {
                            if let Some(ns) = v["mean"]["point_estimate"].as_f64() {
                                let name = p
                                    .parent()
                                    .and_then(|x| x.strip_prefix(&base).ok())
                                    .map(|x| x.display().to_string())
                                    .unwrap_or_default();
                                out.insert(name, ns);
                            }
                        }
                    }
                } else if p
                    .file_name()
                    .is_none_or(|n| n != "report" && n != "base" && n != "change")
                {
                    stack.push(p);
                }
            }
        }
    }
    out
}

/// One perftest figure from the lab VMs.
struct VmFigure {
    stack: &'static str,
    test: &'static str,
    round: usize,
    value: f64,
}

/// RXE to RXE and burst to burst between the two lab VMs (`rxe-vm pair`,
/// QEMU TCG, 1 vCPU each), alternating stacks round by round in one boot:
/// each VM switches between kernel RXE and burst's drop-in libibverbs by
/// loading or removing `rdma_rxe` (which frees UDP 4791). Figures: Debian's
/// `ib_write_bw` 64 KiB (Gb/s) and `ib_send_lat` 2 B (typical, us), and
/// burst-bench's KV workload through libibverbs (`bench`, built with
/// feature `libibverbs`; its JSON points).
fn rxe_pair(
    root: &Path,
    bench: &Path,
    rounds: usize,
) -> Result<(Vec<VmFigure>, Vec<Value>), String> {
    let dir = dropin::build(root).ok_or("build of the drop-in library failed")?;
    let lab = root.join("../shared/rxe-lab/rxe-vm");
    let labnet = root.join("../shared/rxe-lab/labnet.py");
    let labnet = labnet.canonicalize().unwrap_or(labnet);
    let lib = dir.canonicalize().unwrap_or(dir);
    let tests: [(&str, &str); 2] = [
        ("write_bw", "ib_write_bw -F -s 65536 -n 200 --report_gbits"),
        ("send_lat", "ib_send_lat -F -s 2 -n 500"),
    ];
    // Each stack's user-space libraries (rdma-core's libibverbs and
    // librdmacm for RXE, burst's drop-in for burst) are copied into the
    // guest's RAM first: the VMs' root is the host's over 9p without a
    // page cache, so every process reads every code page it runs over
    // virtio again. That costs burst's 2.5 MB of code about 110 ms on a
    // one-connection cmtime run and RXE's (in the kernel, its libraries
    // 250 KB) about 2 ms (docs/performance.md, "cmtime in the lab, again").
    let stacks = [
        (
            "rxe",
            "modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0 2>/dev/null; sleep 1",
            ("rxe0", "$RXE_GID_INDEX"),
            "LD_LIBRARY_PATH=/tmp/bench-rdma-core",
        ),
        (
            "burst",
            "rdma link delete rxe0 2>/dev/null; modprobe -r rdma_rxe",
            // The VM's eth0 holds one IPv4 address: GID 1 in a table laid
            // out as RXE's (0: the link-local default GID).
            ("burst0", "1"),
            "BURST_ADDR=$RXE_IP LD_LIBRARY_PATH=/tmp/bench-burst",
        ),
    ];
    let copy = format!(
        "mkdir -p /tmp/bench-burst /tmp/bench-rdma-core; cp -a {}/. /tmp/bench-burst/; \
         for l in librdmacm.so.1 libibverbs.so.1; do cp -L $(ldconfig -p | awk -v l=$l '$1 == l {{print $NF; exit}}') /tmp/bench-rdma-core/; done; ",
        lib.display()
    );
    let (mut server, mut client) = (copy.clone(), copy);
    let mut port = 24000u16;
    // Names this run's meeting files (the lab's folder outlives a boot).
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for r in 1..=rounds {
        for (stack, switch, (name, gid), env) in stacks {
            server.push_str(&format!("{switch}; "));
            client.push_str(&format!("{switch}; "));
            let ld = env;
            let dev = format!("-d {name} -x {gid}");
            for (test, cmd) in tests {
                port += 1;
                server.push_str(&format!(
                    "{ld} timeout 120 {cmd} {dev} -p {port} >/dev/null 2>&1; "
                ));
                client.push_str(&format!(
                    "/usr/bin/python3 {} synprobe $RXE_SERVER_IP {port} 120 >/dev/null 2>&1; {ld} timeout 120 {cmd} {dev} -p {port} $RXE_SERVER_IP 2>&1 | sed 's/^/VMBENCH {stack} {test} {r} /'; ",
                    labnet.display()
                ));
            }
            // Connection setup: cmtime's connect step (1 and 100
            // connections, 3 runs each, after a warm-up run). A cmtime
            // server (rdmacm-utils 44) serves one client run only: it
            // reuses its QP attributes, into which librdmacm wrote the
            // first connection's CQs, destroyed with that connection, so
            // every later connection is rejected (RXE and burst alike:
            // "failure creating qp"). So each run gets a server of its
            // own, and a run that saw a CM error event is left out. The
            // server never ends and shows no TCP port, so the two VMs
            // meet through files in the folder they share (names unique
            // to this run): the server says it listens, the client says
            // it is done.
            for (k, n) in [1u32, 1, 1, 1, 100, 100, 100].into_iter().enumerate() {
                port += 1;
                let up = format!("$RXE_LAB_STATE/cmtime-up-{run}-{port}");
                let done = format!("$RXE_LAB_STATE/cmtime-done-{run}-{port}");
                server.push_str(&format!(
                    "{ld} timeout 150 cmtime -b $RXE_IP -p {port} >/dev/null 2>&1 & CMP=$!; sleep 2; touch {up}; \
                     i=0; while [ ! -e {done} ] && [ $i -lt 700 ]; do sleep 0.2; i=$((i+1)); done; \
                     kill $CMP 2>/dev/null; wait $CMP 2>/dev/null; "
                ));
                // The first run warms up (ARP, page cache): not reported.
                let report = if k == 0 {
                    ">/dev/null 2>&1".to_string()
                } else {
                    format!(
                        "> $RXE_LAB_STATE/cmtime-out-{run}-{port} 2>&1; \
                         if grep -q '^event:' $RXE_LAB_STATE/cmtime-out-{run}-{port}; then echo 'VMBENCH {stack} cmtime_failed {r} '$(grep -m1 '^event:' $RXE_LAB_STATE/cmtime-out-{run}-{port}); \
                         else grep '^connect ' $RXE_LAB_STATE/cmtime-out-{run}-{port} | sed 's/^/VMBENCH {stack} cmtime_{n} {r} /'; fi"
                    )
                };
                client.push_str(&format!(
                    "i=0; while [ ! -e {up} ] && [ $i -lt 700 ]; do sleep 0.2; i=$((i+1)); done; \
                     {ld} timeout 60 cmtime -s $RXE_SERVER_IP -p {port} -c {n} {report}; touch {done}; "
                ));
            }
            port += 1;
            let (s, c) = kvbench::lab_commands(bench, &labnet, (stack, ld, name, gid), r, port);
            server.push_str(&s);
            client.push_str(&c);
        }
    }
    let _ = Command::new("bash").arg(&lab).arg("setup").status();
    crate::dropin::wait_lab_slot("pair");
    let out = Command::new("timeout")
        .arg((600 + 600 * rounds).to_string())
        .arg("bash")
        .arg(&lab)
        .args(["pair", "--", &server, "---", &client])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("rxe-vm pair: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut figs = Vec::new();
    let kv: Vec<Value> = text.lines().filter_map(kvbench::lab_line).collect();
    for line in text.lines() {
        let Some(rest) = line.split("VMBENCH ").nth(1) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // A cmtime run that saw a CM error event: counted, not timed.
        if f.get(1) == Some(&"cmtime_failed") {
            eprintln!("xtask: bench: lab cmtime run failed: {rest}");
            let stack = if f[0] == "rxe" { "rxe" } else { "burst" };
            let round = f.get(2).and_then(|r| r.parse().ok()).unwrap_or(0);
            figs.push(VmFigure {
                stack,
                test: "cmtime_failed",
                round,
                value: 1.0,
            });
            continue;
        }
        if f.len() < 8 {
            continue;
        }
        let Ok(round) = f[2].parse::<usize>() else {
            continue;
        };
        // cmtime's row: connect : total-ms max-ms min-us us/conn.
        let cmtime = match f[1] {
            "cmtime_1" => Some("cmtime_1"),
            "cmtime_100" => Some("cmtime_100"),
            _ => None,
        };
        if let Some(test) = cmtime {
            if let (Some(&"connect"), Some(Ok(value))) =
                (f.get(3), f.get(5).map(|v| v.parse::<f64>()))
            {
                let stack = if f[0] == "rxe" { "rxe" } else { "burst" };
                figs.push(VmFigure {
                    stack,
                    test,
                    round,
                    value,
                });
            }
            continue;
        }
        // perftest's numbers row: bytes, iterations, then the figures.
        let (Ok(bytes), Ok(_)) = (f[3].parse::<u64>(), f[4].parse::<u64>()) else {
            continue;
        };
        let (test, value) = match (f[1], bytes) {
            // #bytes #iterations BW-peak BW-average MsgRate
            ("write_bw", 65536) => ("write_bw", f[6].parse::<f64>().ok()),
            // #bytes #iterations t_min t_max t_typical ...
            ("send_lat", 2) => ("send_lat", f[7].parse::<f64>().ok()),
            _ => continue,
        };
        let stack = if f[0] == "rxe" { "rxe" } else { "burst" };
        if let Some(value) = value {
            figs.push(VmFigure {
                stack,
                test,
                round,
                value,
            });
        }
    }
    if figs.is_empty() && kv.is_empty() {
        return Err(format!(
            "rxe-vm pair gave no figures (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    Ok((figs, kv))
}

fn plot_bw(path: &Path, sweep: &BTreeMap<String, Vec<(f64, f64)>>) -> Result<(), String> {
    plot_lines(
        path,
        "Bandwidth vs message size (veth pair)",
        ("message size (bytes)", "Gb/s"),
        sweep,
    )
}

/// Named series of (x, y) points on log-log axes fitted to them.
pub(crate) fn plot_lines(
    path: &Path,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let pts = || series.values().flatten().filter(|p| p.0 > 0.0 && p.1 > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for p in pts() {
        (x0, x1, y0, y1) = (x0.min(p.0), x1.max(p.0), y0.min(p.1), y1.max(p.1));
    }
    if x1 == 0.0 {
        return Err(format!("{caption}: no points"));
    }
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut c = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn plot_cdf(path: &Path, cdfs: &BTreeMap<String, Vec<(f64, f64)>>) -> Result<(), String> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    // Up to the 99.9th percentile: the tail beyond is noise on a shared box.
    let xmax = cdfs
        .values()
        .flatten()
        .filter(|p| p.0 <= 0.999)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        * 1.1;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "64 B request/response, half round trip: CDF (veth pair)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..xmax, 0f64..1f64)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("microseconds")
        .y_desc("fraction of samples")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in cdfs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.0 <= 0.999)
            .map(|p| (p.1, p.0))
            .collect();
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// `cargo xtask bench [--rounds N] [--secs S] [--no-sweep] [--no-criterion]
/// [--no-rxe] [--no-kv]`.
pub fn bench(root: &Path, args: &[String]) -> ExitCode {
    let val = |f: &str| args.windows(2).find(|w| w[0] == f).map(|w| w[1].clone());
    let has = |f: &str| args.iter().any(|a| a == f);
    let rounds: usize = val("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let secs = val("--secs").unwrap_or_else(|| "3".into());
    let sweep_on = !has("--no-sweep");
    let mut errors = Vec::new();
    if !has("--no-criterion")
        && !step(
            "criterion micro-benchmarks",
            &mut cargo(
                root,
                &[
                    "bench",
                    "-p",
                    "burst-wire",
                    "-p",
                    "burst-transport",
                    "-p",
                    "burst-dsa",
                    "-p",
                    "burst-verbs",
                    // Only the bench targets (`--benches` would add the
                    // libraries, whose test harness refuses criterion's
                    // options).
                    "--bench",
                    "*",
                    "--",
                    "--warm-up-time",
                    "1",
                    "--measurement-time",
                    "3",
                ],
            ),
        )
    {
        errors.push("criterion: cargo bench failed".to_string());
    }
    if !step(
        "build burst-bench",
        &mut cargo(
            root,
            &[
                "build",
                "--release",
                "-p",
                "burst-bench",
                "--features",
                "libibverbs",
            ],
        ),
    ) {
        return ExitCode::FAILURE;
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let env = Env {
        bin: root.join("target/release/burst-bench"),
        server_cpu: if cpus > 1 { "1".into() } else { "0".into() },
        client_cpu: "0".into(),
    };
    if !dropin::veth_setup(9000) {
        return ExitCode::FAILURE;
    }
    let started = chrono_now();
    let mut results: Vec<Value> = Vec::new();
    let mut port = 26000u16;
    let bw_args = ["-s", "65536", "-D", &secs, "-m", "4096"];
    let lat_args = ["-s", "64", "-D", &secs, "-m", "4096"];
    let lat_e_args = ["-s", "64", "-D", &secs, "-m", "4096", "-e"];
    // Message rate: small WRITEs posted back to back (one QP), where a
    // stack pays per message, not per byte.
    let rate_args = ["-s", "64", "-D", &secs, "-m", "4096"];
    let rate_q64_args = ["-s", "64", "-q", "64", "-D", &secs, "-m", "4096"];
    for r in 0..rounds {
        for t in TRANSPORTS {
            for (test, a) in [
                ("write_bw", &bw_args[..]),
                ("write_bw", &rate_args[..]),
                ("send_lat", &lat_args[..]),
                ("send_lat", &lat_e_args[..]),
            ] {
                port += 1;
                let mut args: Vec<&str> = a.to_vec();
                args.extend(["--transport", t]);
                println!("xtask: bench round {} {test} over {t}", r + 1);
                match run_pair(&env, test, &args, port) {
                    Ok(v) => results.extend(v.into_iter().map(|mut x| {
                        x["round"] = json!(r + 1);
                        x
                    })),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    // burst's other perftest tests, once per round (no alternative exists
    // for READ and atomics over TCP or raw UDP): regressions show here.
    for r in 0..rounds {
        for (test, a) in [
            ("write_lat", &lat_args[..]),
            ("read_lat", &lat_args[..]),
            ("atomic_lat", &["-D", &secs][..]),
            ("send_bw", &bw_args[..]),
            ("read_bw", &bw_args[..]),
            ("atomic_bw", &["-D", &secs][..]),
            ("write_bw", &rate_q64_args[..]),
        ] {
            port += 1;
            println!("xtask: bench round {} {test} over burst", r + 1);
            let q64 = a == &rate_q64_args[..];
            match run_pair(&env, test, a, port) {
                Ok(v) => results.extend(v.into_iter().map(|mut x| {
                    x["round"] = json!(r + 1);
                    // Its own row in the report (not the 1-QP figures).
                    if q64 {
                        x["test"] = json!("write_rate_64_qps");
                    }
                    x
                })),
                Err(e) => errors.push(e),
            }
        }
    }
    let mut sweep: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    if sweep_on {
        for t in TRANSPORTS {
            port += 1;
            println!("xtask: bench size sweep over {t}");
            match run_pair(
                &env,
                "write_bw",
                &["-a", "-D", "0.3", "-m", "4096", "--transport", t],
                port,
            ) {
                Ok(v) => {
                    for x in v {
                        if let (Some(b), Some(g)) = (x["bytes"].as_f64(), x["gbps"].as_f64()) {
                            sweep.entry(t.to_string()).or_default().push((b, g));
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
    }
    // What an idle device costs: two engines with connected QPs, nothing
    // to do for 10 s (loopback; the process's CPU time).
    println!("xtask: bench idle device CPU (10 s)");
    let idle: Option<Value> = Command::new(&env.bin)
        .args(["idle", "--secs", "10", "--json"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice(&o.stdout).ok());
    if idle.is_none() {
        errors.push("idle: burst-bench idle failed".into());
    }
    let kv_veth = if has("--no-kv") {
        Vec::new()
    } else {
        let (s, c) = (&env.server_cpu, &env.client_cpu);
        kvbench::veth(&env.bin, s, c, rounds, &mut port, &mut errors)
    };
    dropin::veth_teardown();
    let (vm, kv_lab) = if has("--no-rxe") {
        (Vec::new(), Vec::new())
    } else {
        println!("xtask: bench RXE vs burst between the two lab VMs ({rounds} rounds)");
        match rxe_pair(root, &env.bin, rounds) {
            Ok(v) => v,
            Err(e) => {
                errors.push(format!("RXE pair: {e}"));
                (Vec::new(), Vec::new())
            }
        }
    };
    // Summaries.
    // A run of `test` with `bytes` per message over transport `t`.
    let is = |x: &Value, test: &str, t: &str, bytes: u64| {
        x["test"] == test && x["transport"] == t && x["bytes"].as_u64() == Some(bytes)
    };
    let pick = |test: &str, t: &str, field: &str, events: bool, bytes: u64| -> Vec<f64> {
        results
            .iter()
            .filter(|x| is(x, test, t, bytes))
            .filter(|x| x["events"].as_bool().unwrap_or(false) == events)
            .filter_map(|x| x[field].as_f64())
            .collect()
    };
    let mut summary = BTreeMap::new();
    // (summary key, test, field, event-driven, bytes per message)
    let figures = [
        ("write_bw", "write_bw", "gbps", false, 65536),
        ("write_rate", "write_bw", "mpps", false, 64),
        ("send_lat", "send_lat", "p50", false, 64),
        ("send_lat", "send_lat", "p99", false, 64),
        ("send_lat_e", "send_lat", "p50", true, 64),
        ("send_lat_e", "send_lat", "p99", true, 64),
    ];
    for t in TRANSPORTS {
        for (key, test, field, events, bytes) in figures {
            summary.insert(
                format!("{key} {t} {field}"),
                pick(test, t, field, events, bytes),
            );
            // CPU cores both sides kept busy (burst-bench's cpu_secs / secs).
            let cores: Vec<f64> = results
                .iter()
                .filter(|x| is(x, test, t, bytes))
                .filter(|x| x["events"].as_bool().unwrap_or(false) == events)
                .filter_map(|x| Some(x["cpu_secs"].as_f64()? / x["secs"].as_f64()?.max(1e-9)))
                .collect();
            summary.insert(format!("{key} {t} cores"), cores);
        }
        // CPU per packet and cores per side at 400 Gb/s (sender, receiver).
        for (i, side) in ["sender", "receiver"].into_iter().enumerate() {
            for field in ["ns_per_pkt", "cores_at_400g"] {
                let v: Vec<f64> = results
                    .iter()
                    .filter(|x| is(x, "write_bw", t, 65536))
                    .filter_map(|x| x[field][i].as_f64())
                    .filter(|v| *v > 0.0)
                    .collect();
                summary.insert(format!("write_bw {t} {field} {side}"), v);
            }
        }
    }
    let vm_pick = |stack: &str, test: &str| -> Vec<f64> {
        vm.iter()
            .filter(|f| f.stack == stack && f.test == test)
            .map(|f| f.value)
            .collect()
    };
    let vm_json: Vec<Value> = vm
        .iter()
        .map(|f| json!({"stack": f.stack, "test": f.test, "round": f.round, "value": f.value}))
        .collect();
    let m = |k: &str| median(summary.get(k).map_or(&[][..], |v| &v[..]));
    let record = json!({
        "started": started,
        "commit": commit(root),
        "machine": machine(),
        "path": "veth pair between netns burstbb1 (198.18.0.101) and burstbb2 (198.18.0.102), link MTU 9000, RoCE MTU 4096",
        "commands": {
            "server": format!("ip netns exec burstbb1 taskset -c {} burst-bench TEST --server --local 198.18.0.101 -p PORT", env.server_cpu),
            "client": format!("ip netns exec burstbb2 taskset -c {} burst-bench TEST ARGS --transport T --json --local 198.18.0.102 -p PORT 198.18.0.101", env.client_cpu),
            "write_bw": bw_args.join(" "),
            "write_rate": rate_args.join(" "),
            "write_rate_64_qps": rate_q64_args.join(" "),
            "send_lat": lat_args.join(" "),
        },
        "rounds": rounds,
        "results": results,
        "sweep": sweep,
        "rxe_vm_pair": {
            "path": "two QEMU TCG VMs (1 vCPU, 1 GiB each) on the lab bridge, link MTU 1500; emulated",
            "commands": "ib_write_bw -F -s 65536 -n 200 --report_gbits (Gb/s, average); ib_send_lat -F -s 2 -n 500 (typical, us); RXE: -d rxe0; burst: -d burst0 with BURST_ADDR and LD_LIBRARY_PATH=target/dropin, rdma_rxe unloaded",
            "figures": vm_json,
        },
        "kv": {"veth": kv_veth, "rxe_vm_pair": kv_lab},
        "idle": idle,
        "criterion_ns": criterion(root),
        "errors": errors,
    });
    // The record lives next to the report it produced (committed with it,
    // so every published figure can be checked), compact: one line.
    let dir = root.join("docs/bench-runs");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("run-{}.json", started.replace([':', ' '], "-")));
    let _ = std::fs::write(&file, serde_json::to_string(&record).unwrap_or_default());
    println!("xtask: bench record: {}", file.display());
    // Report.
    let docs = root.join("docs");
    let plots = docs.join("plots");
    let _ = std::fs::create_dir_all(&plots);
    if !sweep.is_empty() {
        if let Err(e) = plot_bw(&plots.join("bw-vs-size.svg"), &sweep) {
            errors.push(format!("plot: {e}"));
        }
    }
    let mut cdfs = BTreeMap::new();
    // The last round's distribution of each transport in each mode, each
    // series labelled with its mode (busy polling flatters a latency).
    for (t, events) in TRANSPORTS.iter().flat_map(|t| [(t, false), (t, true)]) {
        let mode = if events {
            "event-driven"
        } else {
            "busy-polled"
        };
        if let Some(x) = results.iter().rev().find(|x| {
            x["test"] == "send_lat"
                && x["transport"] == *t
                && x["events"].as_bool().unwrap_or(false) == events
        }) {
            let pts: Vec<(f64, f64)> = x["cdf"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            cdfs.insert(format!("{t} ({mode})"), pts);
        }
    }
    if let Err(e) = plot_cdf(&plots.join("latency-cdf.svg"), &cdfs) {
        errors.push(format!("plot: {e}"));
    }
    let mut md = String::new();
    md.push_str("# burst-bench report (generated by `cargo xtask bench`)\n\n");
    md.push_str(&format!(
        "Run {started}, commit `{}`, {} CPUs ({}), kernel {}. Path: {}. Server and client pinned to CPUs {} and {}; transports alternated (burst, raw UDP, TCP) for {rounds} rounds of {secs} s per test. Raw record: `{}`.\n\n",
        record["commit"].as_str().unwrap_or(""),
        record["machine"]["cpus"],
        record["machine"]["cpu_model"].as_str().unwrap_or(""),
        record["machine"]["kernel"].as_str().unwrap_or(""),
        record["path"].as_str().unwrap_or(""),
        env.server_cpu,
        env.client_cpu,
        file.strip_prefix(root).unwrap_or(&file).display(),
    ));
    md.push_str("| figure | burst | raw UDP (ceiling) | kernel TCP | burst / ceiling | burst / TCP | target | CPU cores (burst / raw UDP / TCP) |\n|---|---|---|---|---|---|---|---|\n");
    let cell = |k: &str| {
        let v = summary.get(k).cloned().unwrap_or_default();
        let (lo, hi) = range(&v);
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2} ({:.2}-{:.2})", median(&v), lo, hi)
        }
    };
    // (row title, summary key prefix, target)
    let rows = [
        (
            "RDMA WRITE 64 KiB, Gb/s",
            "write_bw",
            "gbps",
            ">= 0.9 and >= 2",
        ),
        (
            "RDMA WRITE 64 B, one QP, M messages/s",
            "write_rate",
            "mpps",
            "",
        ),
        (
            "64 B ping-pong half RTT p50, us",
            "send_lat",
            "p50",
            "<= 1.2 and <= 0.8",
        ),
        ("64 B ping-pong half RTT p99, us", "send_lat", "p99", ""),
        ("same, event-driven (-e) p50, us", "send_lat_e", "p50", ""),
        ("same, event-driven (-e) p99, us", "send_lat_e", "p99", ""),
    ];
    let mut suspect = Vec::new();
    let mut hungrier = Vec::new();
    for (title, test, field, target) in rows {
        let key = |t: &str| format!("{test} {t} {field}");
        let vs_ceiling = m(&key("burst")) / m(&key("raw-udp"));
        // A stack cannot beat the path it runs on: above 1.0 for a rate (or
        // below 1.0 for a latency) the ceiling was mismeasured.
        let beats_ceiling = if field == "gbps" || field == "mpps" {
            vs_ceiling > 1.0
        } else {
            vs_ceiling < 1.0
        };
        if beats_ceiling {
            suspect.push(title);
        }
        // The comparison is kernel TCP: burst should not buy its figure
        // with more CPU.
        let cores = |t: &str| m(&format!("{test} {t} cores"));
        let more_cpu = cores("burst") > cores("tcp") * 1.05;
        if more_cpu {
            hungrier.push(format!(
                "{title} ({:.2} cores against TCP's {:.2})",
                cores("burst"),
                cores("tcp")
            ));
        }
        md.push_str(&format!(
            "| {title} | {} | {} | {} | {}{:.2} | {:.2} | {target} | {}{} |\n",
            cell(&key("burst")),
            cell(&key("raw-udp")),
            cell(&key("tcp")),
            if beats_ceiling {
                "**measurement problem** "
            } else {
                ""
            },
            vs_ceiling,
            m(&key("burst")) / m(&key("tcp")),
            if more_cpu {
                "**more CPU than TCP** "
            } else {
                ""
            },
            ["burst", "raw-udp", "tcp"]
                .map(|t| format!("{:.2}", cores(t)))
                .join(" / "),
        ));
    }
    let per_packet = |t: &str| {
        let g = |f: &str, s: &str| m(&format!("write_bw {t} {f} {s}"));
        let ns = g("ns_per_pkt", "sender");
        if ns.is_nan() || ns <= 0.0 {
            // Records from before burst-bench reported it.
            return "-".to_string();
        }
        format!(
            "{:.0} / {:.0} ns ({:.1} / {:.1} cores)",
            g("ns_per_pkt", "sender"),
            g("ns_per_pkt", "receiver"),
            g("cores_at_400g", "sender"),
            g("cores_at_400g", "receiver")
        )
    };
    md.push_str(&format!(
        "| RDMA WRITE 64 KiB: CPU per 4 KiB packet, sender / receiver (cores each side would need for 400 Gb/s at that cost) | {} | {} | {} | | | <= 330 ns (4 cores a side at 400 Gb/s) | |\n",
        per_packet("burst"),
        per_packet("raw-udp"),
        per_packet("tcp"),
    ));
    if let Some(i) = &idle {
        let (cpu, secs) = (
            i["cpu_secs"].as_f64().unwrap_or(0.0),
            i["secs"].as_f64().unwrap_or(1.0),
        );
        md.push_str(&format!(
            "| Idle device: CPU over {secs:.0} s, two engines with {} connected QPs (`burst-bench idle --secs 10`) | {cpu:.4} s ({:.3}% of a core) | | | | | ~0 | |\n",
            i["qps"],
            100.0 * cpu / secs.max(1e-9)
        ));
    }
    // Tails: any latency run whose p99.9 is over 20x its p50 (something
    // slept on the data path, or the machine took the core away).
    let tails: Vec<String> = results
        .iter()
        .filter(|x| {
            let (p50, p999) = (x["p50"].as_f64(), x["p999"].as_f64());
            matches!((p50, p999), (Some(a), Some(b)) if a > 0.0 && b > 20.0 * a)
        })
        .map(|x| {
            format!(
                "{} over {} round {}{}: p50 {:.2} us, p99.9 {:.2} us",
                x["test"].as_str().unwrap_or("?"),
                x["transport"].as_str().unwrap_or("?"),
                x["round"],
                if x["events"].as_bool().unwrap_or(false) {
                    " (-e)"
                } else {
                    ""
                },
                x["p50"].as_f64().unwrap_or(0.0),
                x["p999"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    if !tails.is_empty() {
        md.push_str(&format!(
            "\n**Tails over 20x the median (p99.9 > 20 x p50):** {}.\n",
            tails.join("; ")
        ));
    }
    if !hungrier.is_empty() {
        md.push_str(&format!(
            "\n**burst used more CPU than kernel TCP (over 5% more) in:** {}.\n",
            hungrier.join("; ")
        ));
    }
    if !suspect.is_empty() {
        md.push_str(&format!(
            "\n**Measurement problem:** burst beat its own ceiling in: {}. The raw-UDP ceiling of that run is not a ceiling (noise on the shared machine, or a mismeasured path); read those ratios as unknown.\n",
            suspect.join("; ")
        ));
    }
    md.push('\n');
    md.push_str("Medians with min-max over the rounds. TCP: one stream of 64 KiB writes; request/response busy-polled (non-blocking socket), or with blocking sockets in the event-driven rows. Raw UDP: the same datagrams through burst-io's port code (GSO runs and GRO, as burst uses them) with no transport, no ICRC and no placement (sender blasts, receiver counts); event-driven: blocking in poll(2). burst event-driven: `-e`, completions through a completion channel (the thread sleeps in the kernel).\n\n");
    if !vm.is_empty() {
        md.push_str("## RXE vs burst between the two lab VMs (emulated)\n\nQEMU TCG, 1 vCPU and 1 GiB per VM, link MTU 1500 (RoCE MTU 1024), one boot of `../shared/rxe-lab/rxe-vm pair`; the stacks alternate round by round (each VM loads or unloads `rdma_rxe`). Debian's perftest binaries, unmodified: `ib_write_bw -F -s 65536 -n 200 --report_gbits` and `ib_send_lat -F -s 2 -n 500`; burst through its drop-in libibverbs; each stack's user-space libraries (rdma-core's libibverbs and librdmacm, burst's drop-in) copied into the guest's RAM first, since the VMs' root is the host's over 9p without a page cache (every process would read its code again over virtio); `cmtime` (rdmacm-utils) through burst's drop-in librdmacm against the kernel's RDMA CM, its connect step for 1 and for 100 connections, 3 runs each per round, each against a server of its own (cmtime's server serves one client run: later runs are rejected on every stack), runs that saw a CM error event left out and counted below (a time: below 1 is burst faster; BURST's claim is 1/12). Emulated CPUs: the ratio compares the two stacks on the same slow machine, not real hardware.\n\n| figure | RXE to RXE | burst to burst | burst / RXE |\n|---|---|---|---|\n");
        for (title, test) in [
            ("RDMA WRITE 64 KiB, Gb/s", "write_bw"),
            ("2 B SEND latency, typical, us", "send_lat"),
            ("cmtime, 1 connection: connect step, ms", "cmtime_1"),
            ("cmtime, 100 connections: connect step, ms", "cmtime_100"),
        ] {
            let (r, b) = (vm_pick("rxe", test), vm_pick("burst", test));
            let c = |v: &[f64]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    let (lo, hi) = range(v);
                    format!("{:.4} ({:.4}-{:.4})", median(v), lo, hi)
                }
            };
            md.push_str(&format!(
                "| {title} | {} | {} | {:.2} |\n",
                c(&r),
                c(&b),
                median(&b) / median(&r)
            ));
        }
        let failed = |stack| vm_pick(stack, "cmtime_failed").len();
        md.push_str(&format!(
            "\ncmtime runs that saw a CM error event (left out above): RXE {}, burst {}.\n",
            failed("rxe"),
            failed("burst")
        ));
        md.push('\n');
    }
    md.push_str(
        "![bandwidth vs size](plots/bw-vs-size.svg)\n\n![latency CDF](plots/latency-cdf.svg)\n\n",
    );
    kvbench::report(&mut md, &kv_veth, &kv_lab, &plots, &mut errors);
    md.push_str("## burst's other tests (veth pair, same run)\n\n| test | size | result (median, min-max) | p99 |\n|---|---|---|---|\n");
    for test in [
        "write_lat",
        "read_lat",
        "atomic_lat",
        "send_bw",
        "read_bw",
        "atomic_bw",
        "write_rate_64_qps",
    ] {
        let rows: Vec<&Value> = results
            .iter()
            .filter(|x| x["test"] == test && x["transport"] == "burst")
            .collect();
        let Some(first) = rows.first() else {
            continue;
        };
        let bytes = first["bytes"].as_u64().unwrap_or(0);
        let (field, unit) = if test.starts_with("write_rate") {
            ("mpps", "M messages/s")
        } else if test.ends_with("_bw") {
            ("gbps", "Gb/s")
        } else if first["half_rtt"].as_bool().unwrap_or(false) {
            ("p50", "us half RTT p50")
        } else {
            ("p50", "us RTT p50")
        };
        let v: Vec<f64> = rows.iter().filter_map(|x| x[field].as_f64()).collect();
        let p99: Vec<f64> = rows.iter().filter_map(|x| x["p99"].as_f64()).collect();
        let (lo, hi) = range(&v);
        md.push_str(&format!(
            "| {test} | {bytes} B | {:.2} ({lo:.2}-{hi:.2}) {unit} | {} |\n",
            median(&v),
            if p99.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2} us", median(&p99))
            }
        ));
    }
    md.push('\n');
    let crit = criterion(root);
    if !crit.is_empty() {
        md.push_str("## Criterion micro-benchmarks\n\n`cargo bench -p burst-wire -p burst-transport -p burst-dsa --bench '*' -- --warm-up-time 1 --measurement-time 3`, run by the harness first (unless `--no-criterion`: then the last results in target/criterion). Targets: transport work per 4 KiB packet <= 80 ns (`rc_write_stream_mtu4096/per_message_of_256_packets` / 256); ICRC <= 1.1x raw crc32fast (`write4096/icrc_only` vs `write4096/raw_crc32fast`); copy per 4 KiB: `copy/cpu_4096`.\n\n| benchmark | mean |\n|---|---|\n");
        for (k, ns) in &crit {
            md.push_str(&format!("| {k} | {ns:.1} ns |\n"));
        }
        md.push('\n');
        let get = |k: &str| crit.get(k).copied();
        if let Some(m) = get("rc_write_stream_mtu4096/per_message_of_256_packets") {
            md.push_str(&format!(
                "- Transport work per 4 KiB packet: **{:.1} ns** (target <= 80).\n",
                m / 256.0
            ));
        }
        if let (Some(i), Some(r)) = (get("write4096/icrc_only"), get("write4096/raw_crc32fast")) {
            md.push_str(&format!(
                "- ICRC / raw crc32fast on a 4 KiB packet: **{:.2}x** (target <= 1.1).\n",
                i / r
            ));
        }
        if let Some(c) = get("copy/cpu_4096") {
            md.push_str(&format!(
                "- Copy of 4 KiB (burst-dsa, CPU): **{c:.1} ns**.\n"
            ));
        }
        md.push('\n');
    }
    if !errors.is_empty() {
        md.push_str("## Runs that failed\n\n");
        for e in &errors {
            md.push_str(&format!("- {e}\n"));
        }
    }
    let _ = std::fs::write(docs.join("bench-report.md"), &md);
    println!("{md}");
    println!(
        "bench: {} results, {} failed runs",
        results.len(),
        errors.len()
    );
    if errors.is_empty() && !results.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// UTC time as `YYYY-MM-DDTHH:MM:SSZ` (from `date`, no extra crate).
fn chrono_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
