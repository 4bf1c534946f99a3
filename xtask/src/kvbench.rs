//! The KV-cache transfer workload in `cargo xtask bench`: `burst-bench kv`
//! over the veth pair (burst against kernel TCP, two processes) and, in
//! the lab VM pair, the same sessions through libibverbs on kernel RXE and
//! on burst's drop-in; its section of docs/bench-report.md and its plot.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::dropin::median;

/// The veth sweeps: (what, client arguments). The model is Llama-3-8B's
/// geometry (32 layers, 32 KiB blocks) unless the block size says else.
const VETH_SWEEPS: [(&str, &str); 2] = [
    (
        "request size x concurrency x QPs",
        "--tokens 128,1024,4096,16384 --block-kib 32 --concurrency 1,8 --qps 1,4,16 --requests 8",
    ),
    (
        "block size (16 and 32 KiB: Llama-3-8B-like; 144 and 576 KiB: DeepSeek-R1's layer and block layouts)",
        "--tokens 1024 --block-kib 16,32,144,576 --concurrency 1 --qps 4 --requests 8",
    ),
];
/// The receiver's pool on the veth pair (8 requests of 4k tokens fit).
const VETH_POOL_GIB: &str = "4";

/// The lab's workload: small (TCG-emulated VMs of 1 GiB move ~0.1 Gb/s).
pub const LAB_ARGS: &str = "--transport verbs --tokens 128 --concurrency 1 --qps 1,4 --requests 4 --pool-gib 0.0625 --mtu 1024 --json";
/// The lab server's arguments (its pool: the client's `--pool-gib`).
pub const LAB_SERVER_ARGS: &str = "--pool-gib 0.0625 --mtu 1024";

/// Runs the veth sweeps `rounds` times, transports alternated inside each
/// point (burst-bench kv does it); returns the points, each with its
/// round and sweep.
pub fn veth(
    bin: &Path,
    server_cpu: &str,
    client_cpu: &str,
    rounds: usize,
    port: &mut u16,
    errors: &mut Vec<String>,
) -> Vec<Value> {
    let bin = bin.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for r in 1..=rounds {
        for (sweep, args) in VETH_SWEEPS {
            *port += 1;
            println!("xtask: bench round {r} kv ({sweep})");
            match veth_pair(&bin, server_cpu, client_cpu, args, *port) {
                Ok(v) => out.extend(v.into_iter().map(|mut x| {
                    x["round"] = json!(r);
                    x["sweep"] = json!(sweep);
                    x
                })),
                Err(e) => errors.push(format!("kv {sweep}: {e}")),
            }
        }
    }
    out
}

fn veth_pair(
    bin: &str,
    server_cpu: &str,
    client_cpu: &str,
    args: &str,
    port: u16,
) -> Result<Vec<Value>, String> {
    let control = format!("198.18.0.101:{port}");
    let netns = |ns: &str, cpu: &str| {
        let mut c = Command::new("timeout");
        c.args([
            "900", "ip", "netns", "exec", ns, "taskset", "-c", cpu, bin, "kv",
        ]);
        c
    };
    let mut server = netns("burstbb1", server_cpu);
    server
        .args(["--role", "server", "--control", &control])
        .args(["--addr", "198.18.0.101", "--pool-gib", VETH_POOL_GIB]);
    let mut server = crate::bench::listening(server, "burstbb1", port)?;
    let out = netns("burstbb2", client_cpu)
        .args(["--role", "client", "--control", &control])
        .args(["--addr", "198.18.0.102", "--pool-gib", VETH_POOL_GIB])
        .args(["--transport", "burst,tcp", "--json"])
        .args(args.split_whitespace())
        .output()
        .map_err(|e| format!("client: {e}"))?;
    let _ = server.wait();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// The lab VM commands of one stack's kv run: (server, client), each a
/// bash snippet; the client's JSON lines come out prefixed
/// `VMKV <stack> <round> `. The stack: its name, the environment that
/// selects it (burst: BURST_ADDR and LD_LIBRARY_PATH), its Verbs device
/// and GID index.
pub fn lab_commands(
    bin: &Path,
    labnet: &Path,
    (stack, env, dev, gid): (&str, &str, &str, &str),
    round: usize,
    port: u16,
) -> (String, String) {
    let bin = bin.display();
    let server = format!(
        "{env} timeout 600 {bin} kv --role server --control $RXE_IP:{port} --ibv-dev {dev} --gid-index {gid} {LAB_SERVER_ARGS} >/dev/null 2>&1; "
    );
    let client = format!(
        "/usr/bin/python3 {} synprobe $RXE_SERVER_IP {port} 120 >/dev/null 2>&1; {env} timeout 600 {bin} kv --role client --control $RXE_SERVER_IP:{port} --ibv-dev {dev} --gid-index {gid} {LAB_ARGS} 2>&1 | sed 's/^/VMKV {stack} {round} /'; ",
        labnet.display()
    );
    (server, client)
}

/// Parses a `VMKV <stack> <round> {json}` line.
pub fn lab_line(line: &str) -> Option<Value> {
    let rest = line.split("VMKV ").nth(1)?;
    let mut f = rest.splitn(3, ' ');
    let (stack, round, json) = (f.next()?, f.next()?, f.next()?);
    let mut v: Value = serde_json::from_str(json).ok()?;
    v["stack"] = json!(stack);
    v["round"] = json!(round.parse::<u64>().ok()?);
    Some(v)
}

/// Medians over rounds of `field` for each point key.
fn by_point<'a>(
    points: impl Iterator<Item = &'a Value>,
    key: impl Fn(&Value) -> String,
    field: &str,
) -> BTreeMap<String, Vec<f64>> {
    let mut m: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for p in points {
        if let Some(v) = p[field].as_f64() {
            m.entry(key(p)).or_default().push(v);
        }
    }
    m
}

/// A point's key: tokens, block KiB, concurrency, QPs, zero-padded so
/// the table sorts by them numerically ([`cells`] reads them back).
fn point_key(p: &Value) -> String {
    let n = |f: &str| p[f].as_u64().unwrap_or(0);
    format!(
        "{:08} {:06} {:04} {:05}",
        n("tokens"),
        n("block_kib"),
        n("concurrency"),
        n("qps")
    )
}

/// A point key's four numbers, as text.
fn cells(key: &str) -> Vec<String> {
    key.split_whitespace()
        .map(|f| f.parse::<u64>().map_or(f.to_string(), |n| n.to_string()))
        .collect()
}

/// The KV sections of the report, and the latency-vs-size plot.
pub fn report(
    md: &mut String,
    veth: &[Value],
    lab: &[Value],
    plots: &Path,
    errors: &mut Vec<String>,
) {
    if !veth.is_empty() {
        md.push_str("## KV-cache transfer (burst-xfer), burst vs kernel TCP (veth pair)\n\n");
        md.push_str(&format!(
            "`burst-bench kv` in two processes: receiver `ip netns exec burstbb1 burst-bench kv --role server --control 198.18.0.101:PORT --addr 198.18.0.101 --pool-gib {VETH_POOL_GIB}`, sender `ip netns exec burstbb2 burst-bench kv --role client ... --transport burst,tcp --json` with the sweep's arguments (below). A request writes layers x 2 x tokens/16 blocks to random free slots of the receiver's pool, then the landing notification; latency runs from its first post to the sender learning of the landing (the receiver echoes it on the control connection: one extra one-way trip). Medians over the rounds; CPU seconds per GB for each side (sender / receiver).\n\n"
        ));
        for (sweep, args) in VETH_SWEEPS {
            md.push_str(&format!("### {sweep}\n\n`{args}`\n\n"));
            md.push_str("| tokens | KiB | conc | QPs | burst p50 ms | TCP p50 ms | burst / TCP p50 | burst p99/p50 | burst Gb/s | TCP Gb/s | burst M posts/s | burst CPU s/GB (send / recv) | TCP CPU s/GB (send / recv) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            let of = |t: &str, field: &str| {
                by_point(
                    veth.iter()
                        .filter(|p| p["sweep"] == sweep && p["transport"] == t),
                    point_key,
                    field,
                )
            };
            let (bp50, tp50) = (of("burst", "p50_us"), of("tcp", "p50_us"));
            let (bp99, bgb, tgb) = (
                of("burst", "p99_us"),
                of("burst", "gbps"),
                of("tcp", "gbps"),
            );
            let bpost = of("burst", "post_per_sec");
            let (bcs, bcr) = (
                of("burst", "cpu_s_per_gb"),
                of("burst", "peer_cpu_s_per_gb"),
            );
            let (tcs, tcr) = (of("tcp", "cpu_s_per_gb"), of("tcp", "peer_cpu_s_per_gb"));
            let med =
                |m: &BTreeMap<String, Vec<f64>>, k: &str| m.get(k).map_or(f64::NAN, |v| median(v));
            for k in bp50.keys() {
                let f = cells(k);
                let (b, t) = (med(&bp50, k), med(&tp50, k));
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {:.2} | {:.2} | **{:.2}** | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |\n",
                    f[0], f[1], f[2], f[3],
                    b / 1e3, t / 1e3, b / t,
                    med(&bp99, k) / b,
                    med(&bgb, k), med(&tgb, k),
                    med(&bpost, k) / 1e6,
                    med(&bcs, k), med(&bcr, k), med(&tcs, k), med(&tcr, k),
                ));
            }
            md.push('\n');
        }
        // Latency against request size, one request at a time on 4 QPs.
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for t in ["burst", "tcp"] {
            let m = by_point(
                veth.iter().filter(|p| {
                    p["sweep"] == VETH_SWEEPS[0].0
                        && p["transport"] == t
                        && p["concurrency"] == 1
                        && p["qps"] == 4
                }),
                |p| {
                    format!(
                        "{:012}",
                        p["blocks"].as_u64().unwrap_or(0) * p["block_kib"].as_u64().unwrap_or(0)
                    )
                },
                "p50_us",
            );
            series.insert(
                format!("{t} p50"),
                m.iter()
                    .filter_map(|(k, v)| Some((k.parse::<f64>().ok()? / 1024.0, median(v) / 1e3)))
                    .collect(),
            );
        }
        match crate::bench::plot_lines(
            &plots.join("kv-latency-vs-size.svg"),
            "KV-cache request latency vs size (veth pair, 1 request, 4 QPs)",
            ("request size (MiB)", "p50 latency (ms)"),
            &series,
        ) {
            Ok(()) => {
                md.push_str("![KV request latency vs size](plots/kv-latency-vs-size.svg)\n\n")
            }
            Err(e) => errors.push(format!("plot: {e}")),
        }
    }
    if !lab.is_empty() {
        md.push_str("## KV-cache transfer between the two lab VMs: RXE to RXE vs burst to burst (emulated)\n\n");
        md.push_str(&format!(
            "The identical workload through the system's libibverbs (`burst-bench` built with feature `libibverbs`, `kv --transport verbs`): on kernel RXE (`--ibv-dev rxe0`), and on burst's drop-in (`--ibv-dev burst0`, LD_LIBRARY_PATH=target/dropin, rdma_rxe unloaded), stacks alternated round by round in one boot. Client: `kv --role client {LAB_ARGS}`; server: `kv --role server {LAB_SERVER_ARGS}`. QEMU TCG, 1 vCPU and 1 GiB per VM: the ratio compares the stacks on the same slow machines, not real hardware. RXE's protocol work runs in the kernel (softirq), which the processes' CPU time does not fully count; burst's runs in the process.\n\n| tokens | QPs | RXE Gb/s | burst Gb/s | burst / RXE | RXE p50 ms | burst p50 ms | CPU s/GB RXE (send / recv) | CPU s/GB burst (send / recv) |\n|---|---|---|---|---|---|---|---|---|\n"
        ));
        let of = |s: &str, field: &str| {
            by_point(lab.iter().filter(|p| p["stack"] == s), point_key, field)
        };
        let (rg, bg) = (of("rxe", "gbps"), of("burst", "gbps"));
        let (rl, bl) = (of("rxe", "p50_us"), of("burst", "p50_us"));
        let (rcs, rcr) = (of("rxe", "cpu_s_per_gb"), of("rxe", "peer_cpu_s_per_gb"));
        let (bcs, bcr) = (
            of("burst", "cpu_s_per_gb"),
            of("burst", "peer_cpu_s_per_gb"),
        );
        let med =
            |m: &BTreeMap<String, Vec<f64>>, k: &str| m.get(k).map_or(f64::NAN, |v| median(v));
        for k in rg.keys().chain(bg.keys().filter(|k| !rg.contains_key(*k))) {
            let f = cells(k);
            let cell = |m: &BTreeMap<String, Vec<f64>>| {
                m.get(k).map_or("-".to_string(), |v| {
                    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = v.iter().copied().fold(0.0, f64::max);
                    format!("{:.3} ({lo:.3}-{hi:.3})", median(v))
                })
            };
            md.push_str(&format!(
                "| {} | {} | {} | {} | **{:.2}** | {:.0} | {:.0} | {:.1} / {:.1} | {:.1} / {:.1} |\n",
                f[0], f[3], cell(&rg), cell(&bg),
                med(&bg, k) / med(&rg, k),
                med(&rl, k) / 1e3, med(&bl, k) / 1e3,
                med(&rcs, k), med(&rcr, k), med(&bcs, k), med(&bcr, k),
            ));
        }
        md.push('\n');
    }
}
