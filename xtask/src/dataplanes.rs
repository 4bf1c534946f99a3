//! burst to burst over each kernel-bypass port (root): AF_XDP over a veth
//! pair, DPDK over net_memif between two processes and over net_af_packet
//! on the veth pair. burst-bench's eight tests with the data verified, and
//! the unmodified `ibv_rc_pingpong -c` and `ib_write_bw` on the drop-in.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::dropin::{self, Outcome};
use crate::{cargo, step};

/// One way of running a burst process: environment and namespace, the
/// RDMA address, and where out-of-band TCP goes.
struct Way {
    ns: Option<&'static str>,
    env: Vec<(String, String)>,
    addr: &'static str,
    /// The kernel's address for out-of-band TCP (listen / connect).
    oob: &'static str,
}

/// A port and its two ends.
struct PortCase {
    name: &'static str,
    server: Way,
    client: Way,
    /// Only these tests (default: all eight), with these client arguments.
    tests: Option<&'static [&'static str]>,
    extra: &'static [&'static str],
}

const MEMIF_SOCKET: &str = "/tmp/burst-xtask-memif.sock";

fn memif_args(role: &str, cpu: u32) -> String {
    format!(
        "--lcores=0@{cpu} --vdev=net_memif0,role={role},socket={MEMIF_SOCKET},\
         socket-abstract=no device=net_memif0"
    )
}

fn af_packet_args(iface: &str) -> String {
    format!(
        "--vdev=net_af_packet0,iface={iface},framesz=8192,blocksz=8192,framecnt=512 \
         device=net_af_packet0"
    )
}

fn env(kv: &[(&str, String)]) -> Vec<(String, String)> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn cases() -> Vec<PortCase> {
    vec![
        PortCase {
            name: "AF_XDP over veth",
            server: Way {
                ns: Some("burstbb1"),
                env: env(&[("BURST_PORT", "af-xdp".into())]),
                addr: "198.18.0.101",
                oob: "198.18.0.101",
            },
            client: Way {
                ns: Some("burstbb2"),
                env: env(&[("BURST_PORT", "af-xdp".into())]),
                addr: "198.18.0.102",
                oob: "198.18.0.101",
            },
            tests: None,
            extra: &[],
        },
        PortCase {
            name: "DPDK net_memif",
            server: Way {
                ns: None,
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_DPDK", memif_args("server", 1)),
                ]),
                addr: "198.18.0.201",
                oob: "127.0.0.1",
            },
            client: Way {
                ns: None,
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_DPDK", memif_args("client", 0)),
                ]),
                addr: "198.18.0.202",
                oob: "127.0.0.1",
            },
            tests: None,
            extra: &[],
        },
        PortCase {
            name: "DPDK net_af_packet over veth",
            server: Way {
                ns: Some("burstbb1"),
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_DPDK", af_packet_args("bbveth1")),
                ]),
                // Addresses of burst's own, beside the kernel's on the veths.
                addr: "198.18.0.131",
                oob: "198.18.0.101",
            },
            client: Way {
                ns: Some("burstbb2"),
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_DPDK", af_packet_args("bbveth2")),
                ]),
                addr: "198.18.0.132",
                oob: "198.18.0.101",
            },
            tests: None,
            extra: &[],
        },
        PortCase {
            name: "AF_XDP over a two-queue veth, 2 engine threads each side",
            server: Way {
                ns: Some("burstbb1"),
                env: env(&[
                    ("BURST_PORT", "af-xdp".into()),
                    ("BURST_THREADS", "2".into()),
                ]),
                addr: "198.18.0.103",
                oob: "198.18.0.101",
            },
            client: Way {
                ns: Some("burstbb2"),
                env: env(&[
                    ("BURST_PORT", "af-xdp".into()),
                    ("BURST_THREADS", "2".into()),
                ]),
                addr: "198.18.0.104",
                oob: "198.18.0.101",
            },
            tests: Some(&["write_bw", "read_bw", "send_bw", "send_lat"]),
            extra: &["-q", "4"],
        },
        PortCase {
            name: "DPDK net_memif, 2 engine threads each side",
            server: Way {
                ns: None,
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_THREADS", "2".into()),
                    ("BURST_DPDK", memif_args("server", 1)),
                ]),
                addr: "198.18.0.201",
                oob: "127.0.0.1",
            },
            client: Way {
                ns: None,
                env: env(&[
                    ("BURST_PORT", "dpdk".into()),
                    ("BURST_THREADS", "2".into()),
                    ("BURST_DPDK", memif_args("client", 0)),
                ]),
                addr: "198.18.0.202",
                oob: "127.0.0.1",
            },
            tests: Some(&["write_bw", "read_bw", "send_bw", "send_lat"]),
            extra: &["-q", "4"],
        },
    ]
}

/// A second veth pair between the namespaces, with two queues a side
/// (bbveth3 198.18.0.103 in burstbb1, bbveth4 198.18.0.104 in burstbb2):
/// AF_XDP with an engine thread per queue. Its peers' MACs are written as
/// permanent neighbour entries (the subnet is bbveth1/2's too, so the
/// kernel would resolve through those).
fn two_queue_veth() -> bool {
    let ip = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let exists = Command::new("ip")
        .args(["-n", "burstbb1", "link", "show", "bbveth3"])
        .output()
        .is_ok_and(|o| o.status.success());
    let made = exists
        || (ip(&[
            "-n",
            "burstbb1",
            "link",
            "add",
            "bbveth3",
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
            "type",
            "veth",
            "peer",
            "name",
            "bbveth4",
            "netns",
            "burstbb2",
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
        ]) && ip(&[
            "-n",
            "burstbb1",
            "addr",
            "add",
            "198.18.0.103/24",
            "dev",
            "bbveth3",
        ]) && ip(&[
            "-n",
            "burstbb2",
            "addr",
            "add",
            "198.18.0.104/24",
            "dev",
            "bbveth4",
        ]));
    let up =
        made && ip(&[
            "-n", "burstbb1", "link", "set", "bbveth3", "mtu", "9000", "up",
        ]) && ip(&[
            "-n", "burstbb2", "link", "set", "bbveth4", "mtu", "9000", "up",
        ]);
    let mac = |ns: &str, dev: &str| {
        Command::new("ip")
            .args(["-n", ns, "-br", "link", "show", dev])
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .nth(2)
                    .map(str::to_string)
            })
    };
    let (Some(m3), Some(m4)) = (mac("burstbb1", "bbveth3"), mac("burstbb2", "bbveth4")) else {
        return false;
    };
    up && ip(&[
        "-n",
        "burstbb1",
        "neigh",
        "replace",
        "198.18.0.104",
        "lladdr",
        &m4,
        "dev",
        "bbveth3",
        "nud",
        "permanent",
    ]) && ip(&[
        "-n",
        "burstbb2",
        "neigh",
        "replace",
        "198.18.0.103",
        "lladdr",
        &m3,
        "dev",
        "bbveth4",
        "nud",
        "permanent",
    ])
}

/// burst's GID index for a way's address: a DPDK port's address is on no
/// interface (index 0); an AF_XDP port's is its interface's, in a table
/// laid out as RXE's, read from the device.
fn gid_index(w: &Way, libdir: &str) -> String {
    if w.env.iter().any(|(k, v)| k == "BURST_PORT" && v == "dpdk") {
        return "0".into();
    }
    let mut env = w.env.clone();
    env.push(("LD_LIBRARY_PATH".into(), libdir.into()));
    env.push(("BURST_ADDR".into(), w.addr.into()));
    crate::dropin::burst_gid_index(w.ns, &env, w.addr)
}

fn command(w: &Way, argv: &[String]) -> Command {
    let mut c = Command::new("timeout");
    c.arg("120");
    if let Some(ns) = w.ns {
        c.args(["ip", "netns", "exec", ns]);
    }
    c.args(argv);
    for (k, v) in &w.env {
        c.env(k, v);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn output(child: Child) -> (bool, String) {
    match child.wait_with_output() {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// Runs a server and a client (started 2 s later); both must succeed.
fn pair(
    name: String,
    server: Command,
    client: Command,
    numbers: fn(&str) -> Option<String>,
) -> Outcome {
    let (mut server, mut client) = (server, client);
    let s = match server.spawn() {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                name,
                ok: false,
                numbers: None,
                why: e.to_string(),
            }
        }
    };
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    let c = client.spawn();
    let (cok, cout) = match c {
        Ok(c) => output(c),
        Err(e) => (false, e.to_string()),
    };
    let (sok, sout) = output(s);
    let ok = cok && sok;
    let o = Outcome {
        numbers: numbers(&cout),
        ok,
        why: if ok {
            String::new()
        } else {
            format!(
                "client ({:.1}s): {} / server: {}",
                t.elapsed().as_secs_f64(),
                tail(&cout),
                tail(&sout)
            )
        },
        name,
    };
    println!(
        "xtask: {} {}{}",
        if o.ok { "ok    " } else { "FAILED" },
        o.name,
        o.numbers
            .as_deref()
            .map(|n| format!("  [{n}]"))
            .unwrap_or_default()
    );
    if !o.ok {
        println!("xtask:        {}", o.why);
    }
    o
}

/// The last result line of burst-bench.
fn bench_numbers(out: &str) -> Option<String> {
    out.lines()
        .rfind(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The last line of a pingpong / perftest run.
fn tool_numbers(out: &str) -> Option<String> {
    out.lines()
        .rfind(|l| {
            l.contains("iters in") || l.trim_start().starts_with(|c: char| c.is_ascii_digit())
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Three ICMP echo requests from the kernel (a raw socket) to `argv[1]`;
/// exits 0 when all three are answered with their identifier, sequence
/// and data.
const PING: &str = r#"
import socket, struct, sys
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(1.0)
ok = 0
for seq in (1, 2, 3):
    data = b'burst-ping' * 5
    req = struct.pack('!BBHHH', 8, 0, 0, 0x4242, seq) + data
    req = req[:2] + struct.pack('!H', csum(req)) + req[4:]
    s.sendto(req, (sys.argv[1], 0))
    try:
        while True:
            r, _ = s.recvfrom(2048)
            ihl = (r[0] & 15) * 4
            t, _, _, i, q = struct.unpack('!BBHHH', r[ihl:ihl + 8])
            if (t, i, q) == (0, 0x4242, seq) and r[ihl + 8:] == data:
                ok += 1
                break
    except socket.timeout:
        pass
print('%d/3 echo replies' % ok)
sys.exit(0 if ok == 3 else 1)
"#;

/// A peer pings burst's own address on a DPDK link while burst-bench runs
/// over it: the kernel beside it resolves the address by ARP and gets its
/// echo replies from burst (no kernel owns that address).
fn ping_during_a_run(pc: &PortCase, bench: &str) -> Outcome {
    let argv = |w: &Way, server: bool| {
        let mut a = vec![bench.to_string(), "write_bw".into()];
        if server {
            a.push("--server".into());
        }
        a.extend(["--local", w.addr, "--oob", w.oob, "-p", "19680"].map(String::from));
        if !server {
            a.extend(["-s", "65536", "-D", "8", pc.server.addr].map(String::from));
        }
        a
    };
    let mut server = command(&pc.server, &argv(&pc.server, true));
    let mut client = command(&pc.client, &argv(&pc.client, false));
    let name = format!(
        "{}: a peer's ping answered by burst during write_bw",
        pc.name
    );
    let fail = |why: String| Outcome {
        name: name.clone(),
        ok: false,
        numbers: None,
        why,
    };
    let Ok(s) = server.spawn() else {
        return fail("server did not start".into());
    };
    std::thread::sleep(Duration::from_secs(2));
    let Ok(c) = client.spawn() else {
        return fail("client did not start".into());
    };
    std::thread::sleep(Duration::from_secs(3));
    let mut ping = Command::new("timeout");
    ping.arg("20");
    if let Some(ns) = pc.client.ns {
        ping.args(["ip", "netns", "exec", ns]);
    }
    ping.args(["python3", "-c", PING, pc.server.addr]);
    let (pok, pout) = match ping.output() {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).to_string(),
        ),
        Err(e) => (false, e.to_string()),
    };
    let (cok, cout) = output(c);
    let (sok, sout) = output(s);
    let ok = pok && cok && sok;
    let o = Outcome {
        name,
        ok,
        numbers: Some(pout.trim().to_string()),
        why: if ok {
            String::new()
        } else {
            format!(
                "ping: {} / client: {} / server: {}",
                pout.trim(),
                tail(&cout),
                tail(&sout)
            )
        },
    };
    println!(
        "xtask: {} {}  [{}]",
        if o.ok { "ok    " } else { "FAILED" },
        o.name,
        pout.trim()
    );
    if !o.ok {
        println!("xtask:        {}", o.why);
    }
    o
}

const TESTS: [&str; 8] = [
    "write_bw",
    "read_bw",
    "send_bw",
    "atomic_bw",
    "write_lat",
    "read_lat",
    "send_lat",
    "atomic_lat",
];

/// Builds burst-bench and the drop-in with both features, then runs every
/// port case. `quick`: write_bw and send_lat only.
pub fn run(root: &Path, quick: bool, only: Option<&str>) -> Vec<Outcome> {
    let mut out = Vec::new();
    let feats = ["--features", "af-xdp,dpdk"];
    let built = step(
        "build burst-bench (af-xdp, dpdk)",
        cargo(root, &["build", "--release", "-p", "burst-bench"]).args(feats),
    ) && step(
        "build burst-ibverbs (af-xdp, dpdk)",
        cargo(root, &["build", "--release", "-p", "burst-ibverbs"]).args(feats),
    );
    if !built {
        out.push(Outcome {
            name: "build with af-xdp and dpdk".into(),
            ok: false,
            numbers: None,
            why: "see the build output (clang, libbpf-dev, libdpdk-dev installed?)".into(),
        });
        return out;
    }
    // The drop-in with the features, in a directory of its own.
    let Some(lib) = dropin::lay_out(root, &root.join("target/dropin-bypass")) else {
        out.push(Outcome {
            name: "drop-in library layout".into(),
            ok: false,
            numbers: None,
            why: "see the message above".into(),
        });
        return out;
    };
    if !dropin::veth_setup(9000) {
        out.push(Outcome {
            name: "veth set-up".into(),
            ok: false,
            numbers: None,
            why: "ip netns failed".into(),
        });
        return out;
    }
    if !two_queue_veth() {
        out.push(Outcome {
            name: "two-queue veth set-up".into(),
            ok: false,
            numbers: None,
            why: "ip link add ... numrxqueues 2 failed".into(),
        });
        return out;
    }
    let bench = root.join("target/release/burst-bench");
    let bench = bench.to_string_lossy().to_string();
    let tests: &[&str] = if quick {
        &["write_bw", "send_lat"]
    } else {
        &TESTS
    };
    for pc in cases()
        .into_iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
    {
        let tests = pc.tests.unwrap_or(tests);
        for (k, t) in tests.iter().enumerate() {
            // A memif server whose process ended leaves its socket file.
            let _ = std::fs::remove_file(MEMIF_SOCKET);
            let bw = t.ends_with("_bw");
            let size = if bw { "65536" } else { "64" };
            let n = "2000";
            let port = (19600 + k).to_string();
            let s = command(
                &pc.server,
                &[
                    bench.clone(),
                    t.to_string(),
                    "--server".into(),
                    "--local".into(),
                    pc.server.addr.into(),
                    "--oob".into(),
                    pc.server.oob.into(),
                    "-p".into(),
                    port.clone(),
                ],
            );
            let c = command(
                &pc.client,
                &[
                    bench.clone(),
                    t.to_string(),
                    "--local".into(),
                    pc.client.addr.into(),
                    "--oob".into(),
                    pc.client.oob.into(),
                    "-p".into(),
                    port,
                    "-s".into(),
                    size.into(),
                    "-n".into(),
                    n.into(),
                ]
                .into_iter()
                .chain(pc.extra.iter().map(|a| a.to_string()))
                .chain([pc.server.addr.to_string()])
                .collect::<Vec<_>>(),
            );
            out.push(pair(
                format!("{}: burst-bench {t} (data verified)", pc.name),
                s,
                c,
                bench_numbers,
            ));
        }
        if pc.name.contains("af_packet") {
            out.push(ping_during_a_run(&pc, &bench));
        }
        // The unmodified tools on the drop-in.
        let libdir = lib.to_string_lossy().to_string();
        let tools: [(&str, Vec<&str>); 2] = [
            (
                "ibv_rc_pingpong -c",
                vec![
                    "ibv_rc_pingpong",
                    "-d",
                    "burst0",
                    "-g",
                    "{gid}",
                    "-c",
                    "-n",
                    "500",
                    "-s",
                    "4096",
                ],
            ),
            (
                "ib_write_bw 64 KiB",
                vec![
                    "ib_write_bw",
                    "-d",
                    "burst0",
                    "-x",
                    "{gid}",
                    "-s",
                    "65536",
                    "-n",
                    "2000",
                ],
            ),
        ];
        for (i, (what, argv)) in tools.iter().enumerate() {
            let _ = std::fs::remove_file(MEMIF_SOCKET);
            let tcp_port = (19700 + i).to_string();
            let with = |w: &Way, server_name: Option<&str>| {
                let gid = gid_index(w, &libdir);
                let mut a: Vec<String> = argv.iter().map(|s| s.replace("{gid}", &gid)).collect();
                a.extend(["-p".to_string(), tcp_port.clone()]);
                if let Some(s) = server_name {
                    a.push(s.into());
                }
                let mut c = command(w, &a);
                c.env("LD_LIBRARY_PATH", &libdir).env("BURST_ADDR", w.addr);
                c
            };
            let s = with(&pc.server, None);
            let c = with(&pc.client, Some(pc.client.oob));
            out.push(pair(
                format!("{}: {what} on the drop-in", pc.name),
                s,
                c,
                tool_numbers,
            ));
        }
    }
    dropin::veth_teardown();
    out
}
