//! The drop-in libibverbs: build it, check its exports, and run the
//! unmodified Debian tools (ibverbs-utils, perftest) on it against kernel
//! RXE in the lab VM, against itself over a veth pair between two network
//! namespaces, and against itself on loopback.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{cargo, step};

/// The cargo arguments that build the feature of the kernel-bypass port
/// asked for (BURST_PORT, see `--port`), if any.
pub fn port_features() -> Vec<&'static str> {
    match std::env::var("BURST_PORT").unwrap_or_default().as_str() {
        "af-xdp" | "af-xdp-generic" => vec!["--features", "af-xdp"],
        "dpdk" => vec!["--features", "dpdk"],
        _ => Vec::new(),
    }
}

/// Builds the library (release) and lays out `target/dropin` with the two
/// sonames pointing at it. Returns the directory for `LD_LIBRARY_PATH`.
pub fn build(root: &Path) -> Option<PathBuf> {
    let mut args = vec!["build", "--release", "-p", "burst-ibverbs"];
    args.extend(port_features());
    if !step("build burst-ibverbs", &mut cargo(root, &args)) {
        return None;
    }
    // `burst run` gives UCX the device files it looks for.
    let tool = ["build", "--release", "-p", "burstd", "--bin", "burst"];
    if !step("build the burst tool", &mut cargo(root, &tool)) {
        return None;
    }
    let _ = std::fs::create_dir_all(root.join("target/interop"));
    for (name, libs) in PROGRAMS {
        let mut gcc = Command::new("gcc");
        gcc.args(["-O2", "-Wall", "-o"])
            .arg(program(name))
            .arg(root.join(format!("interop/{name}.c")))
            .args(*libs);
        if !step(&format!("build interop/{name}.c"), &mut gcc) {
            return None;
        }
    }
    lay_out(root, &root.join("target/dropin"))
}

/// Where [`build`] puts program `name` (an absolute path: the lab VM runs
/// it from the host's file system too).
fn program(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/interop")
        .join(name)
}

/// Lays out `dir` for `LD_LIBRARY_PATH`: a copy of the release library
/// (not a link, so a later build does not change a running test) and the
/// two sonames pointing at it.
pub fn lay_out(root: &Path, dir: &Path) -> Option<PathBuf> {
    let _ = std::fs::create_dir_all(dir);
    let lib = dir.join("libburst_ibverbs.so");
    let _ = std::fs::remove_file(&lib);
    if let Err(e) = std::fs::copy(root.join("target/release/libburst_ibverbs.so"), &lib) {
        eprintln!("xtask: cannot copy the library: {e}");
        return None;
    }
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let l = dir.join(name);
        let _ = std::fs::remove_file(&l);
        if let Err(e) = std::os::unix::fs::symlink("libburst_ibverbs.so", &l) {
            eprintln!("xtask: cannot link {name}: {e}");
            return None;
        }
    }
    Some(dir.to_path_buf())
}

/// Compares the library's versioned exports with rdma-core 44's.
pub fn check_exports(root: &Path, dir: &Path) -> bool {
    let want_file = root.join("crates/burst-ibverbs/rdma-core-44-exports.txt");
    let want: std::collections::BTreeSet<String> = match std::fs::read_to_string(&want_file) {
        Ok(t) => t
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        Err(e) => {
            eprintln!("xtask: {}: {e}", want_file.display());
            return false;
        }
    };
    let out = match Command::new("objdump")
        .arg("-T")
        .arg(dir.join("libburst_ibverbs.so"))
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            eprintln!("xtask: objdump -T failed (binutils installed?)");
            return false;
        }
    };
    let have: std::collections::BTreeSet<String> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[1] == "g" && f[3] != "*ABS*")
                .then(|| format!("{} {}", f[f.len() - 2], f[f.len() - 1]))
        })
        .filter(|s| s.contains("IBVERBS") || s.contains("RDMACM"))
        .collect();
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    println!(
        "xtask: exports: {} of rdma-core 44's {} versioned symbols, {} missing, {} extra",
        want.len() - missing.len(),
        want.len(),
        missing.len(),
        extra.len()
    );
    for m in &missing {
        println!("xtask:   missing {m}");
    }
    for x in &extra {
        println!("xtask:   extra {x}");
    }
    missing.is_empty() && extra.is_empty()
}

/// Which family a tool is: they spell the GID index and port differently
/// and print different results.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `ibv_*_pingpong`: `-g`, `-p`; exit status and the "iters" line.
    Pingpong,
    /// perftest: `-x`, `-p`; exit status and a row of numbers.
    Perftest,
    /// `ucx_perftest`: `{dev}` in the arguments, `NAME=value` words as its
    /// environment, the server without test arguments; burst's side under
    /// `burst run` (UCX wants /dev/infiniband and sysfs); the "Final:" row.
    Ucx,
    /// One of burst's own two-sided programs (`interop/NAME.c`, built by
    /// [`build`] against the system libibverbs into `target/interop`):
    /// `-d`, `-g`, `-p`; exit status and its "NAME: ok" line.
    Program,
}

/// One test: the same tool and arguments on both sides.
#[derive(Clone, Copy)]
pub struct Case {
    name: &'static str,
    tool: &'static str,
    args: &'static str,
    kind: Kind,
}

impl Case {
    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

const fn pp(name: &'static str, tool: &'static str, args: &'static str) -> Case {
    Case {
        name,
        tool,
        args,
        kind: Kind::Pingpong,
    }
}

const fn pt(name: &'static str, tool: &'static str, args: &'static str) -> Case {
    Case {
        name,
        tool,
        args,
        kind: Kind::Perftest,
    }
}

const fn ux(name: &'static str, args: &'static str) -> Case {
    Case {
        name,
        tool: "ucx_perftest",
        args,
        kind: Kind::Ucx,
    }
}

const fn prog(name: &'static str, tool: &'static str) -> Case {
    Case {
        name,
        tool,
        args: "",
        kind: Kind::Program,
    }
}

/// Memory windows between two hosts (`interop/mw-peer.c`): a type 1
/// window written, a type 2 window read and invalidated by the peer.
pub const MW: Case = prog("memory windows (interop/mw-peer.c)", "mw-peer");

/// UD multicast between two hosts (`interop/mcast-peer.c`): the receiver
/// attached to a group, the sender to QPN 0xFFFFFF through the group's GID.
pub const MCAST: Case = prog("UD multicast (interop/mcast-peer.c)", "mcast-peer");

/// `cases` less what the port in use cannot run: UD multicast and the
/// link-local GID need the UDP port (the AF_XDP and DPDK ports join no
/// groups and serve their own address only).
pub fn for_port(cases: &'static [Case]) -> &'static [Case] {
    if std::env::var("BURST_PORT").is_ok_and(|p| p != "udp") {
        let v: Vec<Case> = cases
            .iter()
            // Multicast and the link-local GID: the UDP port's alone.
            .filter(|c| c.tool != MCAST.tool && !c.name.contains("link-local"))
            .copied()
            .collect();
        Box::leak(v.into_boxed_slice())
    } else {
        cases
    }
}

/// burst's own two-sided programs, built by [`build`], with the libraries
/// each links (librdmacm-dev's headers for the rdma_cm one).
const PROGRAMS: &[(&str, &[&str])] = &[
    ("mw-peer", &["-libverbs"]),
    ("mcast-peer", &["-libverbs"]),
    ("cm-consecutive", &["-lrdmacm", "-libverbs"]),
    ("cm-fork", &["-lrdmacm", "-libverbs"]),
    ("rsocket-iov", &["-lrdmacm"]),
];

/// UCX over burst: UCT put/AM over rc_verbs and ud_verbs, UCP tag matching
/// (eager and rendezvous) over both.
pub const UCX_CASES: &[Case] = &[
    ux(
        "ucx put_bw 64 KiB rc_verbs zcopy",
        "-t put_bw -x rc_verbs -d {dev}:1 -s 65536 -n 1000 -D zcopy",
    ),
    ux(
        "ucx put_lat 8 B rc_verbs",
        "-t put_lat -x rc_verbs -d {dev}:1 -s 8 -n 1000",
    ),
    ux(
        "ucx am_lat 8 B ud_verbs",
        "-t am_lat -x ud_verbs -d {dev}:1 -s 8 -n 1000",
    ),
    ux(
        "ucx tag_bw 64 KiB rc_verbs (UCP, rendezvous)",
        "UCX_TLS=rc_verbs,ud_verbs -t tag_bw -s 65536 -n 1000",
    ),
    ux(
        "ucx tag_lat 8 B ud_verbs (UCP)",
        "UCX_TLS=ud_verbs -t tag_lat -s 8 -n 1000",
    ),
    // UCX sleeps in its own epoll on the channels after arming its CQs
    // one after another: the lane must be handed over at the arm, and a
    // completion that came to a CQ while another was armed must wake it
    // (it hung, or waited 4 ms per round trip).
    ux(
        "ucx tag_lat 8 B rc_verbs (UCP), sleeping between messages",
        "UCX_TLS=rc_verbs,ud_verbs -t tag_lat -s 8 -n 1000 -E sleep",
    ),
];

/// The IPv6 set against RXE: connected and datagram traffic, one-sided
/// operations (the GRH of UD receives carries IPv6 addresses).
pub const V6_CASES: &[Case] = &[
    pp(
        "rc_pingpong 4 KiB -c",
        "ibv_rc_pingpong",
        "-s 4096 -n 20 -c",
    ),
    pp(
        "ud_pingpong 1000 B -c",
        "ibv_ud_pingpong",
        "-s 1000 -n 20 -c",
    ),
    pt("ib_write_bw 64 KiB", "ib_write_bw", "-F -s 65536 -n 20"),
    pt("ib_read_bw 64 KiB", "ib_read_bw", "-F -s 65536 -n 20"),
    // Both sides' link-local default GIDs (index 0 on RXE and on burst).
    pp(
        "rc_pingpong over the link-local GIDs (-g 0) 4 KiB -c",
        "ibv_rc_pingpong",
        "-g 0 -s 4096 -n 20 -c",
    ),
    MW,
];

/// The IPv6 cases of `--quick`.
pub const V6_QUICK: &[Case] = &[V6_CASES[0], V6_CASES[1], V6_CASES[2]];

/// The UCX cases of `--quick`.
pub const UCX_QUICK: &[Case] = &[UCX_CASES[0], UCX_CASES[3], UCX_CASES[5]];

/// The UCX cases against RXE: UCP only (a UCT test names one device for
/// both sides, so it cannot run between burst0 and rxe0), in an emulated
/// VM (fewer iterations).
pub const UCX_RXE_CASES: &[Case] = &[
    ux(
        "ucx tag_bw 64 KiB rc_verbs (UCP, rendezvous)",
        "UCX_TLS=rc_verbs,ud_verbs -t tag_bw -s 65536 -n 100",
    ),
    ux(
        "ucx tag_lat 8 B ud_verbs (UCP)",
        "UCX_TLS=ud_verbs -t tag_lat -s 8 -n 100",
    ),
    ux(
        "ucx ucp_put_bw 64 KiB rc_verbs (UCP)",
        "UCX_TLS=rc_verbs,ud_verbs -t ucp_put_bw -s 65536 -n 100",
    ),
];

/// The UCX cases against RXE of `--quick`.
pub const UCX_RXE_QUICK: &[Case] = &[UCX_RXE_CASES[0], UCX_RXE_CASES[1]];

/// Every case at MTU 1024 (a 1500-byte link).
pub const CASES: &[Case] = &[
    pp(
        "rc_pingpong 4 KiB -c",
        "ibv_rc_pingpong",
        "-s 4096 -n 20 -c",
    ),
    pp(
        "rc_pingpong 64 KiB -c -e",
        "ibv_rc_pingpong",
        "-s 65536 -n 10 -c -e",
    ),
    pp(
        "rc_pingpong ibv_wr_* API (-N) -c",
        "ibv_rc_pingpong",
        "-N -s 4096 -n 20 -c",
    ),
    pp(
        "uc_pingpong 4 KiB -c",
        "ibv_uc_pingpong",
        "-s 4096 -n 20 -c",
    ),
    pp(
        "uc_pingpong 64 KiB -c -e",
        "ibv_uc_pingpong",
        "-s 65536 -n 10 -c -e",
    ),
    pp(
        "ud_pingpong 1000 B -c",
        "ibv_ud_pingpong",
        "-s 1000 -n 20 -c",
    ),
    pp(
        "ud_pingpong 512 B -c -e",
        "ibv_ud_pingpong",
        "-s 512 -n 20 -c -e",
    ),
    pp(
        "srq_pingpong 4 QPs 4 KiB -c",
        "ibv_srq_pingpong",
        "-q 4 -s 4096 -n 10 -c",
    ),
    pp(
        "srq_pingpong 4 QPs 64 KiB -c -e",
        "ibv_srq_pingpong",
        "-q 4 -s 65536 -n 5 -c -e",
    ),
    pt("ib_write_bw 64 KiB", "ib_write_bw", "-F -s 65536 -n 20"),
    pt(
        "ib_write_bw 4 KiB -q 4",
        "ib_write_bw",
        "-F -s 4096 -n 20 -q 4",
    ),
    pt(
        "ib_write_bw 16 KiB -b",
        "ib_write_bw",
        "-F -s 16384 -n 20 -b",
    ),
    pt("ib_write_bw -a", "ib_write_bw", "-F -a -n 5"),
    pt("ib_write_lat 2 B", "ib_write_lat", "-F -s 2 -n 20"),
    pt("ib_read_bw 64 KiB", "ib_read_bw", "-F -s 65536 -n 20"),
    pt(
        "ib_read_bw 4 KiB -q 4",
        "ib_read_bw",
        "-F -s 4096 -n 20 -q 4",
    ),
    pt("ib_read_lat 2 B", "ib_read_lat", "-F -s 2 -n 20"),
    // Many QPs at once (issue 12): without congestion control burst overran
    // RXE and ended in RETRY_EXC_ERR (2 of 4 runs at 8 x 4 KiB).
    pt(
        "ib_write_bw 4 KiB -q 8",
        "ib_write_bw",
        "-F -s 4096 -n 400 -q 8",
    ),
    pt(
        "ib_write_bw 4 KiB -q 16",
        "ib_write_bw",
        "-F -s 4096 -n 200 -q 16",
    ),
    // Many QPs against RXE (issue 34): 64 QPs, each moving 50 WRITEs.
    pt(
        "ib_write_bw 4 KiB -q 64",
        "ib_write_bw",
        "-F -s 4096 -n 50 -q 64",
    ),
    pt(
        "ib_write_bw 64 KiB -q 8",
        "ib_write_bw",
        "-F -s 65536 -n 25 -q 8",
    ),
    pt(
        "ib_write_bw 64 KiB -q 16",
        "ib_write_bw",
        "-F -s 65536 -n 12 -q 16",
    ),
    pt(
        "ib_read_bw 4 KiB -q 8",
        "ib_read_bw",
        "-F -s 4096 -n 400 -q 8",
    ),
    pt(
        "ib_read_bw 4 KiB -q 16",
        "ib_read_bw",
        "-F -s 4096 -n 200 -q 16",
    ),
    pt(
        "ib_read_bw 64 KiB -q 8",
        "ib_read_bw",
        "-F -s 65536 -n 25 -q 8",
    ),
    pt(
        "ib_read_bw 64 KiB -q 16",
        "ib_read_bw",
        "-F -s 65536 -n 12 -q 16",
    ),
    pt("ib_send_bw 64 KiB", "ib_send_bw", "-F -s 65536 -n 20"),
    pt("ib_send_bw 4 KiB -b", "ib_send_bw", "-F -s 4096 -n 20 -b"),
    pt("ib_send_lat 2 B", "ib_send_lat", "-F -s 2 -n 20"),
    pt(
        "ib_atomic_bw fetch-add",
        "ib_atomic_bw",
        "-F -n 20 -A FETCH_AND_ADD",
    ),
    pt(
        "ib_atomic_bw cmp-swap",
        "ib_atomic_bw",
        "-F -n 20 -A CMP_AND_SWAP",
    ),
    pt(
        "ib_atomic_lat fetch-add",
        "ib_atomic_lat",
        "-F -n 20 -A FETCH_AND_ADD",
    ),
    pt(
        "ib_atomic_lat cmp-swap",
        "ib_atomic_lat",
        "-F -n 20 -A CMP_AND_SWAP",
    ),
    MW,
    MCAST,
];

/// The cases at MTU 4096 (a 9000-byte link).
/// burst to burst through the link-local default GID (index 0, IPv6 with
/// the interface as scope), as RXE's `-g 0`: the later `-g` wins.
pub const LINK_LOCAL: &[Case] = &[
    pp(
        "rc_pingpong over the link-local GID (-g 0) 64 KiB -c",
        "ibv_rc_pingpong",
        "-g 0 -s 65536 -n 20 -c",
    ),
    pp(
        "ud_pingpong over the link-local GID (-g 0) 1000 B -c",
        "ibv_ud_pingpong",
        "-g 0 -s 1000 -n 20 -c",
    ),
];

pub const CASES_4096: &[Case] = &[
    pp(
        "rc_pingpong MTU 4096 64 KiB -c",
        "ibv_rc_pingpong",
        "-m 4096 -s 65536 -n 10 -c",
    ),
    pp(
        "srq_pingpong MTU 4096 -c",
        "ibv_srq_pingpong",
        "-m 4096 -q 4 -s 16384 -n 5 -c",
    ),
    pt(
        "ib_write_bw MTU 4096 64 KiB",
        "ib_write_bw",
        "-F -m 4096 -s 65536 -n 20",
    ),
    pt(
        "ib_read_bw MTU 4096 64 KiB",
        "ib_read_bw",
        "-F -m 4096 -s 65536 -n 20",
    ),
    pt(
        "ib_send_bw MTU 4096 64 KiB -b",
        "ib_send_bw",
        "-F -m 4096 -s 65536 -n 20 -b",
    ),
    pt(
        "ib_send_lat MTU 4096 2 B",
        "ib_send_lat",
        "-F -m 4096 -s 2 -n 20",
    ),
];

/// The few cases CI runs (one VM boot each way).
pub const QUICK: &[Case] = &[
    pp(
        "rc_pingpong 4 KiB -c",
        "ibv_rc_pingpong",
        "-s 4096 -n 20 -c",
    ),
    pp(
        "srq_pingpong 4 QPs 4 KiB -c -e",
        "ibv_srq_pingpong",
        "-q 4 -s 4096 -n 5 -c -e",
    ),
    pt("ib_write_bw 64 KiB", "ib_write_bw", "-F -s 65536 -n 20"),
    pt(
        "ib_write_bw 4 KiB -q 8",
        "ib_write_bw",
        "-F -s 4096 -n 400 -q 8",
    ),
    pt("ib_send_lat 2 B", "ib_send_lat", "-F -s 2 -n 20"),
    MW,
    MCAST,
];

/// The arguments of `c` for one side: device, GID index, port, peer.
fn tool_args(c: &Case, dev: &str, gid: &str, port: u16, peer: Option<&str>) -> Vec<String> {
    if c.kind == Kind::Ucx {
        let (env, args): (Vec<&str>, Vec<&str>) =
            c.args.split_whitespace().partition(|w| w.contains('='));
        let mut v: Vec<String> = vec!["env".into(), format!("UCX_NET_DEVICES={dev}:1")];
        // RXE's UD completions leave the RoCE packet type out of `sl` (mlx5
        // and burst put it there), so UCX on RXE cannot check the GRH's
        // destination GID: RXE's own UCX needs the check off, whoever the peer.
        if dev.starts_with("rxe") {
            v.push("UCX_UD_VERBS_ETH_DGID_CHECK=n".into());
        }
        v.extend(env.into_iter().map(String::from));
        v.push(c.tool.into());
        if peer.is_some() {
            v.extend(args.iter().map(|a| a.replace("{dev}", dev)));
        }
        v.extend(["-p".into(), port.to_string()]);
        v.extend(peer.map(String::from));
        return v;
    }
    let tool = if c.kind == Kind::Program {
        program(c.tool).to_string_lossy().into_owned()
    } else {
        c.tool.into()
    };
    let mut v: Vec<String> = vec![tool, "-d".into(), dev.into()];
    v.push(if c.kind == Kind::Perftest { "-x" } else { "-g" }.into());
    v.push(gid.into());
    v.extend(c.args.split_whitespace().map(String::from));
    v.push("-p".into());
    v.push(port.to_string());
    v.extend(peer.map(String::from));
    v
}

/// The result line a passing run prints: perftest's row of numbers, or
/// the pingpongs' "N iters in T seconds" line.
fn result_line(c: &Case, out: &str) -> Option<String> {
    match c.kind {
        Kind::Pingpong => out
            .lines()
            .find(|l| l.contains(" iters in "))
            .map(|l| l.trim().to_string()),
        Kind::Program => out
            .lines()
            .find(|l| l.starts_with(&format!("{}: ok", c.tool)))
            .map(|l| l.trim().to_string()),
        Kind::Ucx => out
            .lines()
            .find(|l| l.starts_with("Final:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
        Kind::Perftest => out
            .lines()
            .rfind(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 4 && f.iter().all(|x| x.parse::<f64>().is_ok())
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
    }
}

/// A child whose output is collected in the background.
pub(crate) struct Run {
    child: Child,
    out: std::thread::JoinHandle<String>,
}

/// Waits (up to 2 minutes) until the lab's VM slot `slot` (`run-a`,
/// `pair`) is free: `rxe-vm` refuses a locked slot at once, and the VM of
/// the case before may still be shutting down (a run that started then
/// failed every case with "never listened" after two 300 s waits).
pub(crate) fn wait_lab_slot(slot: &str) {
    let base = std::env::var_os("RXE_LAB_RUNDIR")
        .map_or_else(|| PathBuf::from("/run/rxe-lab"), PathBuf::from);
    let lock = base.join(format!("{slot}.lock"));
    if !lock.exists() {
        return;
    }
    let free = Command::new("flock")
        .args(["-w", "120"])
        .arg(&lock)
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !free {
        println!(
            "xtask: lab slot {slot} still locked after 120 s ({})",
            lock.display()
        );
    }
}

/// Waits until the VM of `vm` listens on `port` (the lab's `wait-port`,
/// up to 300 s), giving up as soon as the VM's run has ended.
fn wait_vm_listening(lab: &Path, port: u16, vm: &mut Run) -> bool {
    use std::os::unix::process::CommandExt;
    let Ok(mut w) = Command::new("bash")
        .arg(lab)
        .args(["wait-port", &port.to_string(), "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
    else {
        return false;
    };
    loop {
        if let Ok(Some(s)) = w.try_wait() {
            return s.success();
        }
        if let Ok(Some(_)) = vm.child.try_wait() {
            // Its probe too (a process group of its own).
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", w.id())])
                .status();
            let _ = w.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) fn spawn(argv: &[String]) -> std::io::Result<Run> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        let mut e = String::new();
        let _ = se.read_to_string(&mut e);
        s + &e
    });
    Ok(Run { child, out })
}

impl Run {
    /// Stops the run: SIGTERM to `timeout`, which passes it on to the tool
    /// (a SIGKILL would leave the tool running and its pipes open).
    pub(crate) fn stop(self) -> (bool, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.wait()
    }

    /// Whether the process is still running, looking for up to `within`.
    pub(crate) fn running_after(&mut self, within: Duration) -> bool {
        let end = Instant::now() + within;
        loop {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            if Instant::now() >= end {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn wait(mut self) -> (bool, String) {
        let ok = self.child.wait().is_ok_and(|s| s.success());
        (ok, self.out.join().unwrap_or_default())
    }
}

/// Waits until a TCP listener on `port` exists (in namespace `ns`, if any).
pub fn wait_listen(ns: Option<&str>, port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let mut c = match ns {
            Some(n) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", n, "ss", "-Hltn"]);
                c
            }
            None => {
                let mut c = Command::new("ss");
                c.arg("-Hltn");
                c
            }
        };
        if let Ok(o) = c.output() {
            let s = String::from_utf8_lossy(&o.stdout);
            if s.lines().any(|l| l.contains(&format!(":{port} "))) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Where a burst side runs: a namespace (or none) and its address.
#[derive(Clone)]
pub struct BurstSide {
    pub ns: Option<String>,
    pub addr: String,
    pub libdir: PathBuf,
    /// burst's RDMA address when it is not `addr` (a DPDK port owns an
    /// address of its own beside the kernel's, which carries the tools'
    /// out-of-band TCP).
    pub rdma_addr: Option<String>,
    /// Daemon mode: burstd's socket for this side (the tools get
    /// BURST_DAEMON instead of BURST_ADDR).
    pub daemon: Option<PathBuf>,
}

/// The burstd binary when the run is in daemon mode (`--daemon`: the
/// tools on burst's side talk to a burstd per side instead of embedding
/// an engine).
pub fn daemon_mode() -> Option<PathBuf> {
    std::env::var_os("BURST_XTASK_BURSTD").map(PathBuf::from)
}

/// A burstd serving one side; stopped when dropped.
pub struct DaemonGuard {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts a burstd on `addr` in `ns` (dropping one packet in `drop_every`
/// if set), if the run is in daemon mode.
pub fn start_daemon(ns: Option<&str>, addr: &str, drop_every: Option<u32>) -> Option<DaemonGuard> {
    let bin = daemon_mode()?;
    let dir = std::env::temp_dir().join("burst-xtask-interop");
    let _ = std::fs::create_dir_all(&dir);
    let socket = dir.join(format!("{addr}.sock"));
    let _ = std::fs::remove_file(&socket);
    let mut c = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", n]).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    c.args(["--addr", addr, "--socket"])
        .arg(&socket)
        .env("BURST_LOG", "warn")
        .stdin(Stdio::null());
    if let Some(n) = drop_every {
        c.env("BURST_TEST_DROP", n.to_string());
    }
    let child = match c.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask: cannot start burstd: {e}");
            return None;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "xtask: burstd serving {addr}{} at {}",
        ns.map(|n| format!(" in {n}")).unwrap_or_default(),
        socket.display()
    );
    Some(DaemonGuard { child, socket })
}

/// The GID index of burst's device for its address `addr`, read as a user
/// reads it (`ibv_devinfo -v` through the drop-in, in namespace `ns` with
/// `env`): the device lays its table out as RXE's, so an interface's IPv4
/// address is at 1 (0: its link-local default GID), an address of no
/// interface (unassigned loopback) at 0. Remembered per side; "0" (with a
/// warning) if the table does not list the address.
pub fn burst_gid_index(ns: Option<&str>, env: &[(String, String)], addr: &str) -> String {
    static SEEN: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{ns:?} {env:?} {addr}");
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, g)) = seen.iter().find(|(k, _)| *k == key) {
        return g.clone();
    }
    let mut c = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", n, "ibv_devinfo"]);
            c
        }
        None => Command::new("ibv_devinfo"),
    };
    c.args(["-v", "-d", "burst0"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    let out = c
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let want = match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => format!("::ffff:{addr},"),
        _ => format!("{addr},"),
    };
    let index = out
        .lines()
        .find(|l| l.contains("GID[") && l.split_whitespace().any(|w| w == want))
        .and_then(|l| l.split('[').nth(1)?.split(']').next())
        .map(|i| i.trim().to_string());
    let g = index.unwrap_or_else(|| {
        eprintln!("xtask: burst's GID table does not list {addr}: using GID index 0");
        "0".into()
    });
    println!("xtask: burst's GID index for {addr}: {g}");
    seen.push((key, g.clone()));
    g
}

impl BurstSide {
    /// The environment burst's tools get on this side.
    fn env(&self) -> Vec<(String, String)> {
        let mut v = vec![match &self.daemon {
            Some(sock) => ("BURST_DAEMON".to_string(), sock.display().to_string()),
            None => (
                "BURST_ADDR".to_string(),
                self.rdma_addr.as_deref().unwrap_or(&self.addr).to_string(),
            ),
        }];
        v.push((
            "LD_LIBRARY_PATH".to_string(),
            self.libdir.display().to_string(),
        ));
        v
    }

    fn argv(&self, c: &Case, port: u16, peer: Option<&str>) -> Vec<String> {
        let mut v: Vec<String> = vec!["timeout".into(), "150".into()];
        if let Some(n) = &self.ns {
            v.extend(["ip", "netns", "exec", n].map(String::from));
        }
        v.push("env".into());
        let env = self.env();
        v.extend(env.iter().map(|(k, val)| format!("{k}={val}")));
        if c.kind == Kind::Ucx {
            // `lay_out`'s directory is target/dropin: the tool is beside.
            let burst = self.libdir.join("../release/burst");
            v.extend([
                burst.to_string_lossy().into_owned(),
                "run".into(),
                "--".into(),
            ]);
        }
        let addr = self.rdma_addr.as_deref().unwrap_or(&self.addr);
        let gid = burst_gid_index(self.ns.as_deref(), &env, addr);
        v.extend(tool_args(c, "burst0", &gid, port, peer));
        v
    }
}

/// Outcome of one scenario.
pub struct Outcome {
    pub name: String,
    pub ok: bool,
    pub numbers: Option<String>,
    pub why: String,
}

/// Every failed case [`summary`] saw, with its reason: `cargo xtask test`
/// repeats them at the end, since CI keeps only the tail of a run's output.
static FAILED_CASES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The failed cases so far ([`FAILED_CASES`]).
pub fn failed_cases() -> Vec<String> {
    FAILED_CASES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

pub(crate) fn report(o: &Outcome) {
    println!(
        "xtask: {} {}{}{}",
        if o.ok { "ok    " } else { "FAILED" },
        o.name,
        o.numbers
            .as_deref()
            .map(|n| format!("  [{n}]"))
            .unwrap_or_default(),
        if o.ok {
            String::new()
        } else {
            format!("  ({})", o.why)
        }
    );
}

/// Runs `cases` with both sides on burst: `server` serves, `client` connects.
pub fn burst_pair(
    cases: &[Case],
    server: &BurstSide,
    client: &BurstSide,
    label: &str,
    base_port: u16,
) -> Vec<Outcome> {
    let mut out = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        let name = format!("{label}: {}", c.name);
        let s = match spawn(&server.argv(c, port, None)) {
            Ok(s) => s,
            Err(e) => {
                out.push(Outcome {
                    name,
                    ok: false,
                    numbers: None,
                    why: format!("spawn: {e}"),
                });
                continue;
            }
        };
        let listening = wait_listen(server.ns.as_deref(), port, Duration::from_secs(20));
        let (cok, cout) = if listening {
            match spawn(&client.argv(c, port, Some(&server.addr))) {
                Ok(r) => r.wait(),
                Err(e) => (false, format!("spawn: {e}")),
            }
        } else {
            (false, "server never listened".into())
        };
        if !cok {
            // Do not leave a server waiting for a client that failed.
            let (_, sout) = s.stop();
            let o = Outcome {
                name,
                ok: false,
                numbers: None,
                why: tail(&(cout + &sout)),
            };
            report(&o);
            out.push(o);
            continue;
        }
        let (sok, sout) = s.wait();
        let numbers = result_line(c, &cout);
        let ok = sok && numbers.is_some();
        let o = Outcome {
            name,
            ok,
            numbers,
            why: if ok {
                String::new()
            } else {
                tail(&(cout + &sout))
            },
        };
        report(&o);
        out.push(o);
    }
    out
}

pub(crate) fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// Creates (idempotently) two namespaces joined by a veth pair:
/// `burstbb1` 198.18.0.101 and `burstbb2` 198.18.0.102, link MTU `mtu`.
pub fn veth_setup(mtu: u32) -> bool {
    let run = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let exists = Command::new("ip")
        .args(["netns", "exec", "burstbb1", "ip", "link", "show", "bbveth1"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !exists {
        let _ = run(&["netns", "del", "burstbb1"]);
        let _ = run(&["netns", "del", "burstbb2"]);
        let ok = run(&["netns", "add", "burstbb1"])
            && run(&["netns", "add", "burstbb2"])
            && run(&[
                "link", "add", "bbveth1", "netns", "burstbb1", "type", "veth", "peer", "name",
                "bbveth2", "netns", "burstbb2",
            ])
            && run(&[
                "-n",
                "burstbb1",
                "addr",
                "add",
                "198.18.0.101/24",
                "dev",
                "bbveth1",
            ])
            && run(&[
                "-n",
                "burstbb2",
                "addr",
                "add",
                "198.18.0.102/24",
                "dev",
                "bbveth2",
            ])
            && run(&["-n", "burstbb1", "link", "set", "lo", "up"])
            && run(&["-n", "burstbb2", "link", "set", "lo", "up"]);
        if !ok {
            eprintln!("xtask: cannot create the veth namespaces (root needed)");
            return false;
        }
    }
    let m = mtu.to_string();
    let up = run(&["-n", "burstbb1", "link", "set", "bbveth1", "mtu", &m, "up"])
        && run(&["-n", "burstbb2", "link", "set", "bbveth2", "mtu", &m, "up"]);
    // The link-local addresses (GID 0) take traffic once their duplicate
    // address detection ends (about a second after the link comes up).
    let deadline = Instant::now() + Duration::from_secs(5);
    while up && Instant::now() < deadline {
        let tentative = ["burstbb1", "burstbb2"].iter().any(|ns| {
            Command::new("ip")
                .args(["-n", ns, "-6", "addr", "show", "tentative"])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty())
        });
        if !tentative {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    up
}

/// Removes the veth namespaces.
pub fn veth_teardown() {
    for n in ["burstbb1", "burstbb2"] {
        let _ = Command::new("ip").args(["netns", "del", n]).status();
    }
}

/// burst to burst over the veth pair, every case at MTU 1024 and 4096.
/// Open MPI (Debian's openmpi-bin) over UCX's verbs transports on burst,
/// one rank on each side of the veth pair, embedded: `mpirun` in the first
/// namespace starts the second rank through an `ssh` stand-in that enters
/// the other namespace. `interop/mpi-pingpong.c` checks every byte of a
/// ping-pong from 8 B to 4 MiB, then an allreduce.
pub fn mpi_veth(root: &Path, dir: &Path) -> Vec<Outcome> {
    let name =
        "Open MPI over UCX (rc_verbs), burst<->burst veth: ping-pong 8 B-4 MiB checked, allreduce";
    let fail = |why: String| failed(name, why);
    let bin = root.join("target/interop/mpi-pingpong");
    let _ = std::fs::create_dir_all(root.join("target/interop"));
    let built = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(root.join("interop/mpi-pingpong.c"))
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        return fail(
            "cannot build interop/mpi-pingpong.c (openmpi-bin and libopenmpi-dev needed)".into(),
        );
    }
    if !veth_setup(1500) {
        return fail("ip netns failed".into());
    }
    let burst = root.join("target/release/burst");
    // mpirun's remote shell: the host is an address of one namespace.
    let agent = root.join("target/interop/mpi-agent.sh");
    let script = format!(
        "#!/bin/bash\n\
         # plm_rsh_agent for cargo xtask interop: HOST CMD... runs CMD in HOST's namespace on burst\n\
         case $1 in 198.18.0.101) ns=burstbb1;; 198.18.0.102) ns=burstbb2;; *) echo \"unknown host $1\" >&2; exit 1;; esac\n\
         h=$1; shift\n\
         exec ip netns exec $ns env BURST_ADDR=$h LD_LIBRARY_PATH={} {} run -- bash -c \"$*\"\n",
        dir.display(),
        burst.display()
    );
    let written = std::fs::write(&agent, script).is_ok()
        && Command::new("chmod")
            .arg("+x")
            .arg(&agent)
            .status()
            .is_ok_and(|s| s.success());
    if !written {
        return fail(format!("cannot write {}", agent.display()));
    }
    let out = Command::new("timeout")
        .arg("180")
        .args([
            "ip",
            "netns",
            "exec",
            "burstbb1",
            "env",
            "BURST_ADDR=198.18.0.101",
        ])
        .arg(format!("LD_LIBRARY_PATH={}", dir.display()))
        .arg(&burst)
        .args(["run", "--", "mpirun", "--allow-run-as-root"])
        // Both "hosts" are this machine: each would bind its rank to its
        // first core, the same one.
        .args([
            "--bind-to",
            "none",
            "-np",
            "2",
            "-H",
            "198.18.0.101,198.18.0.102",
        ])
        .arg("--mca")
        .arg("plm_rsh_agent")
        .arg(&agent)
        .args(["--mca", "pml", "ucx", "--mca", "btl", "^openib,ofi"])
        .args([
            "-x",
            "UCX_TLS=rc_verbs,ud_verbs,self",
            "-x",
            "UCX_NET_DEVICES=burst0:1",
        ])
        .args(["-x", "LD_LIBRARY_PATH"])
        .arg(&bin)
        .output();
    let o = match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            let sizes = text.lines().filter(|l| l.starts_with("size ")).count();
            let ok = o.status.success()
                && sizes == 5
                && text.contains("allreduce ok")
                && !text.contains("BAD");
            // "size 8: 24.29 us half round trip, 0.3 MB/s"
            let line = |size: &str| {
                text.lines()
                    .find(|l| l.starts_with(size))
                    .unwrap_or_default()
                    .to_string()
            };
            Outcome {
                name: name.into(),
                ok,
                numbers: Some(format!("{}; {}", line("size 8:"), line("size 4194304:"))),
                why: tail(&text),
            }
        }
        Err(e) => return fail(format!("spawn: {e}")),
    };
    report(&o);
    vec![o]
}

pub fn veth(dir: &Path, cases: &[Case], cases_4096: &[Case]) -> Vec<Outcome> {
    let a = BurstSide {
        ns: Some("burstbb1".into()),
        addr: "198.18.0.101".into(),
        libdir: dir.into(),
        rdma_addr: None,
        daemon: None,
    };
    let b = BurstSide {
        ns: Some("burstbb2".into()),
        addr: "198.18.0.102".into(),
        libdir: dir.into(),
        rdma_addr: None,
        daemon: None,
    };
    let mut out = Vec::new();
    if !veth_setup(1500) {
        out.push(Outcome {
            name: "veth set-up".into(),
            ok: false,
            numbers: None,
            why: "ip netns failed".into(),
        });
        return out;
    }
    let (da, db) = (
        start_daemon(a.ns.as_deref(), &a.addr, None),
        start_daemon(b.ns.as_deref(), &b.addr, None),
    );
    let (mut a, mut b) = (a, b);
    a.daemon = da.as_ref().map(|d| d.socket.clone());
    b.daemon = db.as_ref().map(|d| d.socket.clone());
    out.extend(burst_pair(cases, &a, &b, "burst<->burst veth", 21000));
    out.extend(burst_pair(
        for_port(LINK_LOCAL),
        &a,
        &b,
        "burst<->burst veth",
        21090,
    ));
    // Daemons read the link MTU when they start: new ones for MTU 9000.
    drop((da, db));
    if !cases_4096.is_empty() && veth_setup(9000) {
        let (da, db) = (
            start_daemon(a.ns.as_deref(), &a.addr, None),
            start_daemon(b.ns.as_deref(), &b.addr, None),
        );
        a.daemon = da.as_ref().map(|d| d.socket.clone());
        b.daemon = db.as_ref().map(|d| d.socket.clone());
        out.extend(burst_pair(
            cases_4096,
            &a,
            &b,
            "burst<->burst veth 9000",
            21100,
        ));
    }
    veth_teardown();
    out
}

/// Against kernel RXE in the lab VM: one VM boot per direction and MTU.
/// `vm_serves`: the VM runs the servers and burst the clients, else the
/// other way round.
pub fn rxe(
    root: &Path,
    dir: &Path,
    cases: &[Case],
    eth_mtu: &str,
    vm_serves: bool,
    base_port: u16,
) -> Vec<Outcome> {
    rxe_run(
        root,
        dir,
        cases,
        eth_mtu,
        vm_serves,
        base_port,
        Lab::default(),
    )
}

/// How [`rxe_run`] uses the lab: a capture of the VM's tap, IPv6.
#[derive(Default, Clone, Copy)]
struct Lab<'a> {
    capture: Option<&'a Path>,
    v6: bool,
}

/// burst's IPv6 address on the lab's bridge, and RXE's on the VM's eth0
/// (unique local addresses: the lab's namespace routes nothing out).
pub const LAB_V6: (&str, &str) = ("fd00:198:18::1", "fd00:198:18::2");

/// Turns IPv6 on in the lab's namespace, which keeps it off, for the
/// bridge (and the taps the VMs attach to), and gives burst [`LAB_V6`]'s
/// first address there. Run after `rxe-vm setup`.
pub fn lab_v6_host() {
    for dev in ["rxebr0", "rxetap0", "rxetap1"] {
        let _ = Command::new("ip")
            .args(["netns", "exec", "burstlab", "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{dev}.disable_ipv6=0"))
            .status();
    }
    let _ = Command::new("ip")
        .args(["netns", "exec", "burstlab", "ip", "-6", "addr", "replace"])
        .arg(format!("{}/64", LAB_V6.0))
        .args(["dev", "rxebr0", "nodad"])
        .stderr(Stdio::null())
        .status();
}

/// The VM's half of [`lab_v6_host`]: a shell line that gives its eth0
/// [`LAB_V6`]'s second address (no duplicate address detection: usable
/// at once; RXE lists its GID a moment later).
pub fn lab_v6_vm() -> String {
    format!("ip -6 addr add {}/64 dev eth0 nodad; sleep 1; ", LAB_V6.1)
}

/// [`rxe`] over IPv6: burst on [`LAB_V6`]'s first address (IPv6 enabled on
/// the lab's bridge for it), RXE through the GID of the second, which the
/// VM adds to its interface first. The tools' own TCP stays on IPv4.
pub fn rxe_v6(
    root: &Path,
    dir: &Path,
    cases: &[Case],
    vm_serves: bool,
    base_port: u16,
) -> Vec<Outcome> {
    let lab = Lab {
        capture: None,
        v6: true,
    };
    rxe_run(root, dir, cases, "1500", vm_serves, base_port, lab)
}

/// The cases whose traffic `wire_check` captures: multi-packet messages
/// from burst (GSO runs of 62 packets at MTU 1024) and from RXE.
pub const WIRE: &[Case] = &[
    pt("ib_write_bw 64 KiB", "ib_write_bw", "-F -s 65536 -n 20"),
    pt("ib_send_bw 64 KiB -b", "ib_send_bw", "-F -s 65536 -n 20 -b"),
];

/// burst client -> RXE server with the VM's tap captured, then every
/// captured packet's ICRC checked by the lab's independent `check-icrc.py`
/// (scapy and its own annex A17 code) against the real IP headers: the
/// proof that burst's GSO sends carry the IP IDs their ICRCs were sealed
/// with.
pub fn wire_check(root: &Path, dir: &Path, base_port: u16) -> Vec<Outcome> {
    let out_dir = root.join("target/interop");
    let _ = std::fs::create_dir_all(&out_dir);
    let pcap = out_dir.join("burst-to-rxe.pcapng");
    let _ = std::fs::remove_file(&pcap);
    let lab = Lab {
        capture: Some(&pcap),
        v6: false,
    };
    let mut v = rxe_run(root, dir, WIRE, "1500", true, base_port, lab);
    let check = root.join("../shared/rxe-lab/check-icrc.py");
    let r = Command::new("python3")
        .arg(&check)
        .arg("--quiet")
        .arg(&pcap)
        .output();
    let (ok, text) = match r {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        ),
        Err(e) => (false, format!("check-icrc.py: {e}")),
    };
    let summary = text
        .lines()
        .find(|l| l.contains("SUMMARY"))
        .unwrap_or("")
        .trim()
        .to_string();
    let o = Outcome {
        name: format!(
            "ICRC of every captured burst<->RXE packet ({})",
            pcap.strip_prefix(root).unwrap_or(&pcap).display()
        ),
        ok,
        numbers: (!summary.is_empty()).then(|| summary.clone()),
        why: if ok { String::new() } else { tail(&text) },
    };
    report(&o);
    v.push(o);
    v
}

fn rxe_run(
    root: &Path,
    dir: &Path,
    cases: &[Case],
    eth_mtu: &str,
    vm_serves: bool,
    base_port: u16,
    Lab { capture, v6 }: Lab<'_>,
) -> Vec<Outcome> {
    let lab = root.join("../shared/rxe-lab/rxe-vm");
    let labnet = root.join("../shared/rxe-lab/labnet.py");
    let labnet = labnet.canonicalize().unwrap_or(labnet);
    // Through DPDK (--port dpdk), burst owns 198.18.0.10 on the bridge
    // (net_af_packet on rxebr0) beside the kernel's 198.18.0.1.
    let dpdk = std::env::var("BURST_PORT").is_ok_and(|p| p == "dpdk");
    let mut host = BurstSide {
        ns: Some("burstlab".into()),
        addr: "198.18.0.1".into(),
        libdir: dir.into(),
        rdma_addr: if v6 {
            Some(LAB_V6.0.into())
        } else {
            dpdk.then(|| "198.18.0.10".into())
        },
        daemon: None,
    };
    let _ = Command::new("bash").arg(&lab).arg("setup").status();
    if v6 {
        lab_v6_host();
    }
    let burst_addr = if v6 { LAB_V6.0 } else { "198.18.0.1" };
    let _daemon = start_daemon(Some("burstlab"), burst_addr, None);
    host.daemon = _daemon.as_ref().map(|d| d.socket.clone());
    let dirn = if vm_serves {
        "burst client -> RXE server"
    } else {
        "RXE client -> burst server"
    };
    let label = if v6 {
        format!("{dirn} over IPv6 (link MTU {eth_mtu})")
    } else {
        format!("{dirn} (link MTU {eth_mtu})")
    };
    // The VM's script: each case in turn, its exit status on a marker line.
    let mut script = String::new();
    if v6 {
        // RXE lists the new address's GID once the address is up: its
        // index replaces the IPv4 one the lab found.
        let gid = LAB_V6
            .1
            .parse::<std::net::Ipv6Addr>()
            .map(|a| {
                a.segments()
                    .iter()
                    .map(|s| format!("{s:04x}"))
                    .collect::<Vec<_>>()
                    .join(":")
            })
            .unwrap_or_default();
        script.push_str(&lab_v6_vm());
        script.push_str(&format!(
            "g=$(grep -lx {gid} /sys/class/infiniband/rxe0/ports/1/gids/* | head -n 1); \
             RXE_GID_INDEX=${{g##*/}}; echo RXE IPv6 GID index $RXE_GID_INDEX; "
        ));
    }
    for (i, c) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        let peer = (!vm_serves).then_some("198.18.0.1");
        let argv = tool_args(c, "rxe0", "$RXE_GID_INDEX", port, peer).join(" ");
        if !vm_serves {
            script.push_str(&format!(
                "/usr/bin/python3 {} synprobe 198.18.0.1 {port} 300 >/dev/null 2>&1; ",
                labnet.display()
            ));
        }
        script.push_str(&format!(
            "timeout 150 {argv} > /tmp/case{i}.log 2>&1; rc=$?; echo VMRESULT {i} $rc; tail -n 4 /tmp/case{i}.log | sed 's/^/VMLOG {i} /'; "
        ));
    }
    wait_lab_slot("run-a");
    let vm = match spawn(
        &[
            "bash".into(),
            lab.to_string_lossy().into_owned(),
            "run".into(),
            "--mtu".into(),
            eth_mtu.into(),
            "--timeout".into(),
            (300 + 160 * cases.len()).to_string(),
        ]
        .into_iter()
        .chain(
            capture
                .into_iter()
                .flat_map(|p| ["--capture".into(), p.to_string_lossy().into_owned()]),
        )
        .chain(["--".into(), script])
        .collect::<Vec<String>>(),
    ) {
        Ok(v) => v,
        Err(e) => {
            return vec![Outcome {
                name: label,
                ok: false,
                numbers: None,
                why: format!("VM: {e}"),
            }];
        }
    };
    let mut vm = vm;
    let mut host_results: Vec<(bool, String)> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        let r = if vm_serves {
            if wait_vm_listening(&lab, port, &mut vm) {
                match spawn(&host.argv(c, port, Some("198.18.0.2"))) {
                    Ok(r) => r.wait(),
                    Err(e) => (false, format!("spawn: {e}")),
                }
            } else {
                (false, "the RXE server never listened".into())
            }
        } else {
            match spawn(&host.argv(c, port, None)) {
                Ok(s) => {
                    let _ = wait_listen(Some("burstlab"), port, Duration::from_secs(20));
                    s.wait()
                }
                Err(e) => (false, format!("spawn: {e}")),
            }
        };
        host_results.push(r);
    }
    let (_, vm_out) = vm.wait();
    let mut out = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let marker = format!("VMRESULT {i} ");
        let vm_rc = vm_out
            .lines()
            .find_map(|l| l.strip_prefix(&marker))
            .map(|r| r.trim().to_string());
        let vm_log: Vec<&str> = vm_out
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("VMLOG {i} ")))
            .collect();
        let (hok, hout) = &host_results[i];
        let numbers = result_line(c, hout).or_else(|| result_line(c, &vm_log.join("\n")));
        let vm_ok = vm_rc.as_deref() == Some("0");
        let ok = *hok && vm_ok && numbers.is_some();
        let why = if ok {
            String::new()
        } else if vm_rc.is_none() {
            // The VM never ran the case: what the lab said instead.
            format!(
                "burst: {} / RXE did not run it: {}",
                tail(hout),
                vm_out.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            )
        } else {
            format!(
                "burst: {} / RXE exit {}: {}",
                tail(hout),
                vm_rc.as_deref().unwrap_or("none"),
                vm_log.join(" | ")
            )
        };
        let o = Outcome {
            name: format!("{label}: {}", c.name),
            ok,
            numbers,
            why,
        };
        report(&o);
        out.push(o);
    }
    out
}

/// Prints the closing line and returns whether all passed.
pub fn summary(what: &str, all: &[Outcome]) -> bool {
    let passed = all.iter().filter(|o| o.ok).count();
    let failed = all.len() - passed;
    let mut kept = FAILED_CASES.lock().unwrap_or_else(|e| e.into_inner());
    for o in all.iter().filter(|o| !o.ok) {
        let why: String = o.why.chars().take(400).collect();
        kept.push(format!("{what}: {}: {why}", o.name));
    }
    println!("{what}: {passed} passed, {failed} failed");
    failed == 0
}

/// One measurement: burst's figure and TCP's, from the same run.
pub struct Figure {
    pub what: &'static str,
    pub burst: Vec<f64>,
    pub tcp: Vec<f64>,
    pub unit: &'static str,
}

/// The median (upper middle; NaN for no values).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

/// Runs a server in namespace `ns` and a client in the other; returns the
/// client's output.
fn ns_pair(
    server: &[&str],
    ns_s: &str,
    client: &[&str],
    ns_c: &str,
    port: u16,
    env: &[(&str, &str)],
) -> Option<String> {
    let with_ns = |ns: &str, argv: &[&str], addr: &str| -> Vec<String> {
        let mut v: Vec<String> = ["timeout", "120", "ip", "netns", "exec", ns, "env"]
            .map(String::from)
            .to_vec();
        v.push(format!("BURST_ADDR={addr}"));
        v.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        v.extend(argv.iter().map(|s| s.to_string()));
        v
    };
    let s = spawn(&with_ns(ns_s, server, "198.18.0.101")).ok()?;
    if !wait_listen(Some(ns_s), port, Duration::from_secs(20)) {
        let _ = s.stop();
        return None;
    }
    let (ok, out) = match spawn(&with_ns(ns_c, client, "198.18.0.102")) {
        Ok(c) => c.wait(),
        Err(_) => (false, String::new()),
    };
    // sockperf's server keeps running: stop it (perftest's and iperf3 -1
    // have ended already).
    let _ = s.stop();
    ok.then_some(out)
}

fn parse_after(out: &str, key: &str) -> Option<f64> {
    let at = out.rfind(key)? + key.len();
    out[at..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| !t.is_empty())?
        .parse()
        .ok()
}

/// burst (perftest on the drop-in) next to kernel TCP (iperf3, sockperf)
/// over the veth pair: RDMA WRITE 64 KiB bandwidth and 2-byte SEND latency,
/// alternating A B A B for `rounds` rounds.
pub fn numbers(dir: &Path, rounds: usize) -> Vec<Figure> {
    let lib = dir.display().to_string();
    let env = [("LD_LIBRARY_PATH", lib.as_str())];
    let mut bw = Figure {
        what: "64 KiB RDMA WRITE vs TCP stream (Gb/s)",
        burst: vec![],
        tcp: vec![],
        unit: "Gb/s",
    };
    let mut lat = Figure {
        what: "2 B SEND ping-pong half round trip, median (us)",
        burst: vec![],
        tcp: vec![],
        unit: "us",
    };
    let mut lat99 = Figure {
        what: "2 B SEND ping-pong half round trip, 99th percentile (us)",
        burst: vec![],
        tcp: vec![],
        unit: "us",
    };
    if !veth_setup(1500) {
        return vec![];
    }
    for r in 0..rounds {
        let p = 25000 + 10 * r as u16;
        let ps = p.to_string();
        let wb = [
            "ib_write_bw",
            "-F",
            "-x",
            "0",
            "-s",
            "65536",
            "-D",
            "4",
            "--report_gbits",
            "-p",
            &ps,
        ];
        let mut wc = wb.to_vec();
        wc.push("198.18.0.101");
        if let Some(o) = ns_pair(&wb, "burstbb1", &wc, "burstbb2", p, &env) {
            let rc = Case {
                name: "",
                tool: "",
                args: "",
                kind: Kind::Perftest,
            };
            if let Some(row) = result_line(&rc, &o) {
                let f: Vec<f64> = row.split(' ').filter_map(|x| x.parse().ok()).collect();
                if f.len() >= 4 {
                    bw.burst.push(f[3]);
                }
            }
        }
        let p2 = (p + 1).to_string();
        if let Some(o) = ns_pair(
            &["iperf3", "-s", "-1", "-p", &p2],
            "burstbb1",
            &[
                "iperf3",
                "-c",
                "198.18.0.101",
                "-p",
                &p2,
                "-t",
                "4",
                "-l",
                "64K",
                "-f",
                "g",
            ],
            "burstbb2",
            p + 1,
            &[],
        ) {
            // The receiver's line: "... X Gbits/sec ... receiver".
            if let Some(l) = o.lines().find(|l| l.contains("receiver")) {
                if let Some(g) = l
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .windows(2)
                    .find(|w| w[1] == "Gbits/sec")
                    .and_then(|w| w[0].parse().ok())
                {
                    bw.tcp.push(g);
                }
            }
        }
        let p3 = (p + 2).to_string();
        let sl = [
            "ib_send_lat",
            "-F",
            "-x",
            "0",
            "-s",
            "2",
            "-n",
            "20000",
            "-p",
            &p3,
        ];
        let mut sc = sl.to_vec();
        sc.push("198.18.0.101");
        if let Some(o) = ns_pair(&sl, "burstbb1", &sc, "burstbb2", p + 2, &env) {
            let rc = Case {
                name: "",
                tool: "",
                args: "",
                kind: Kind::Perftest,
            };
            if let Some(row) = result_line(&rc, &o) {
                let f: Vec<f64> = row.split(' ').filter_map(|x| x.parse().ok()).collect();
                // bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
                if f.len() >= 8 {
                    lat.burst.push(f[4]);
                    lat99.burst.push(f[7]);
                }
            }
        }
        let p4 = (p + 3).to_string();
        if let Some(o) = ns_pair(
            &["sockperf", "sr", "--tcp", "-i", "198.18.0.101", "-p", &p4],
            "burstbb1",
            &[
                "sockperf",
                "pp",
                "--tcp",
                "-i",
                "198.18.0.101",
                "-p",
                &p4,
                "-m",
                "14",
                "-t",
                "4",
            ],
            "burstbb2",
            p + 3,
            &[],
        ) {
            if let (Some(m), Some(p99)) = (
                parse_after(&o, "percentile 50.000 ="),
                parse_after(&o, "percentile 99.000 ="),
            ) {
                lat.tcp.push(m);
                lat99.tcp.push(p99);
            }
        }
    }
    veth_teardown();
    for f in [&bw, &lat, &lat99] {
        let u = f.unit;
        println!(
            "xtask: {}: burst {:?} (median {:.2} {u}) tcp {:?} (median {:.2} {u}) ratio burst/tcp {:.2}",
            f.what,
            f.burst,
            median(&f.burst),
            f.tcp,
            median(&f.tcp),
            median(&f.burst) / median(&f.tcp)
        );
    }
    vec![bw, lat, lat99]
}

/// `ibv_devices` and `ibv_devinfo -v` on the drop-in: the device, its port
/// and its RoCE v2 GID are listed; with nothing configured, no device and
/// a message that says what to set.
pub fn device_listing(dir: &Path) -> Vec<Outcome> {
    let run = |tool: &[&str], addr: Option<&str>| -> (bool, String) {
        let mut c = Command::new(tool[0]);
        c.args(&tool[1..])
            .env("LD_LIBRARY_PATH", dir)
            .env_remove("BURST_ADDR");
        // No config file either: the checks see the variables only.
        c.env_remove("BURST_IFACE")
            .env_remove("BURST_CONFIG")
            .env("XDG_CONFIG_HOME", "/nonexistent-burst");
        if let Some(a) = addr {
            c.env("BURST_ADDR", a);
        }
        match c.output() {
            Ok(o) => (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr),
            ),
            Err(e) => (false, e.to_string()),
        }
    };
    // (what, command, BURST_ADDR, strings the output must contain)
    type Check<'a> = (&'a str, &'a [&'a str], Option<&'a str>, &'a [&'a str]);
    let checks: [Check; 3] = [
        (
            "ibv_devices lists burst0",
            &["ibv_devices"],
            Some("127.0.95.1"),
            &["burst0", "0200fffffe005f01"],
        ),
        (
            "ibv_devinfo -v: port, link layer, RoCE v2 GID",
            &["ibv_devinfo", "-v"],
            Some("127.0.95.1"),
            &[
                "hca_id:\tburst0",
                "PORT_ACTIVE (4)",
                "Ethernet",
                "::ffff:127.0.95.1, RoCE v2",
                "active_mtu:\t\t4096 (5)",
                "max_qp_rd_atom:\t\t\t16",
            ],
        ),
        (
            "ibv_devices without configuration says what to set",
            &["ibv_devices"],
            None,
            &["no device configured", "BURST_ADDR"],
        ),
    ];
    let mut out = Vec::new();
    for (name, tool, addr, want) in checks {
        let (ok, text) = run(tool, addr);
        let missing: Vec<&str> = want
            .iter()
            .filter(|w| !text.contains(*w))
            .copied()
            .collect();
        let o = Outcome {
            name: name.into(),
            ok: ok && missing.is_empty(),
            numbers: None,
            why: format!("missing {missing:?} in: {}", tail(&text)),
        };
        report(&o);
        out.push(o);
    }
    out
}

/// `interop/verbs-conformance.c` (built against the system libibverbs) on
/// the drop-in, in one process on loopback: extended queries, `cmd_fd`,
/// `ibv_create_qp_ex`'s attributes, posts by QP state and queue depth.
pub fn conformance(root: &Path, dir: &Path) -> Vec<Outcome> {
    let name = "verbs conformance (interop/verbs-conformance.c) on the drop-in".to_string();
    let Some(bin) = build_conformance(root) else {
        return vec![not_built(name)];
    };
    let mut c = Command::new("timeout");
    c.arg("60")
        .arg(&bin)
        .env("BURST_ADDR", "127.0.96.1")
        .env("LD_LIBRARY_PATH", dir);
    let o = conformance_outcome(name, c.output());
    report(&o);
    vec![o]
}

/// The same program on kernel RXE in the lab VM: what burst is held to.
pub fn conformance_rxe(root: &Path) -> Vec<Outcome> {
    let name = "verbs conformance (interop/verbs-conformance.c) on kernel RXE".to_string();
    let Some(bin) = build_conformance(root) else {
        return vec![not_built(name)];
    };
    let lab = root.join("../shared/rxe-lab/rxe-vm");
    wait_lab_slot("run-a");
    let mut c = Command::new("bash");
    c.arg(&lab)
        .args(["run", "--timeout", "200", "--"])
        .arg(format!("{} rxe0 $RXE_GID_INDEX", bin.display()));
    let o = conformance_outcome(name, c.output());
    report(&o);
    vec![o]
}

/// A failed outcome of `name`, reported.
fn failed(name: &str, why: String) -> Vec<Outcome> {
    let o = Outcome {
        name: name.into(),
        ok: false,
        numbers: None,
        why,
    };
    report(&o);
    vec![o]
}

/// Cases of rdma-core's own test suite (Debian's python3-pyverbs) that
/// must run, not skip, through burstd: everything a RoCE device without
/// the vendor extensions (mlx5, EFA, ODP, device memory, XRC, raw packet
/// QPs) offers, RDMA ATOMIC WRITE included. RXE 6.1 in the lab runs 87 of
/// them (one fails there: atomic write, which RXE has from Linux 6.2).
/// Embedded, the 10 rdma_cm cases are left out: their two players are
/// forked from the runner, which needs burstd.
pub const RDMA_CORE_RUN: usize = 101;
const RDMA_CORE_RUN_EMBEDDED: usize = RDMA_CORE_RUN - 10;

/// rdma-core's test suite as Debian ships it
/// (`/usr/share/doc/rdma-core/tests`, some files compressed), unpacked
/// under `target/rdma-core-tests`; run by `/usr/bin/python3` (pyverbs is
/// Debian's, for its Python).
pub fn rdma_core_suite(root: &Path) -> Result<PathBuf, String> {
    let src = Path::new("/usr/share/doc/rdma-core/tests");
    if !Path::new("/usr/lib/python3/dist-packages/pyverbs").is_dir() || !src.is_dir() {
        return Err("needs Debian's python3-pyverbs (apt-get install python3-pyverbs)".into());
    }
    let dir = root.join("target/rdma-core-tests");
    let _ = std::fs::remove_dir_all(&dir);
    let unpacked = Command::new("cp")
        .arg("-r")
        .arg(src)
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("sh")
            .arg("-c")
            .arg(format!("gunzip -f {}/*.gz", dir.display()))
            .status()
            .is_ok_and(|s| s.success());
    if unpacked {
        Ok(dir)
    } else {
        Err(format!(
            "cannot unpack {} into {}",
            src.display(),
            dir.display()
        ))
    }
}

/// The suite's verdict: it exited 0, said OK, and ran (not skipped) at
/// least `floor` cases (a device that stopped offering something shows as
/// fewer cases run, not as a failure of the suite).
pub fn rdma_core_outcome(name: &str, exited_ok: bool, out: &str, floor: usize) -> Outcome {
    // "Ran 273 tests in 9.4s" and "OK (skipped=173)".
    let count = |key: &str| {
        out.lines()
            .find_map(|l| l.split(key).nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok())
    };
    let ran = count("Ran ").unwrap_or(0);
    let skipped = count("skipped=").unwrap_or(0);
    let run = ran.saturating_sub(skipped);
    let failed: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with("... ERROR") || l.ends_with("... FAIL") || l.starts_with("ERROR:"))
        .collect();
    Outcome {
        name: name.into(),
        ok: exited_ok && out.lines().any(|l| l.starts_with("OK")) && run >= floor,
        numbers: Some(format!("{run} run, {skipped} skipped (vendor features)")),
        why: if failed.is_empty() {
            format!("{run} cases run (at least {floor} expected): {}", tail(out))
        } else {
            failed.join("; ")
        },
    }
}

/// rdma-core's test suite on the drop-in, embedded, on an address of
/// loopback: every module but the rdma_cm one (see [`RDMA_CORE_RUN`]).
pub fn rdma_core_tests(root: &Path, dir: &Path) -> Vec<Outcome> {
    let name = "rdma-core's test suite (pyverbs) on the drop-in, embedded";
    let suite = match rdma_core_suite(root) {
        Ok(s) => s,
        Err(why) => return failed(name, why),
    };
    let modules: Vec<String> = std::fs::read_dir(&suite)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|f| f.starts_with("test_") && f.ends_with(".py") && f != "test_rdmacm.py")
        .map(|f| f.trim_end_matches(".py").to_string())
        .collect();
    let out = Command::new("timeout")
        .arg("600")
        .arg("/usr/bin/python3")
        .arg(suite.join("run_tests.py"))
        .arg("-v")
        .args(&modules)
        .env("BURST_ADDR", "127.0.96.5")
        .env("LD_LIBRARY_PATH", dir)
        .output();
    let o = match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            rdma_core_outcome(name, o.status.success(), &text, RDMA_CORE_RUN_EMBEDDED)
        }
        Err(e) => return failed(name, format!("spawn: {e}")),
    };
    report(&o);
    vec![o]
}

fn build_conformance(root: &Path) -> Option<PathBuf> {
    let bin = root.join("target/interop/verbs-conformance");
    let _ = std::fs::create_dir_all(root.join("target/interop"));
    Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(root.join("interop/verbs-conformance.c"))
        .args(["-lrdmacm", "-libverbs"])
        .status()
        .is_ok_and(|s| s.success())
        .then_some(bin)
}

fn not_built(name: String) -> Outcome {
    let o = Outcome {
        name,
        ok: false,
        numbers: None,
        why: "cannot build it (gcc, libibverbs-dev and librdmacm-dev needed)".into(),
    };
    report(&o);
    o
}

/// Passes when the program ran, printed checks and none failed.
fn conformance_outcome(name: String, out: std::io::Result<std::process::Output>) -> Outcome {
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
            let checks = text.lines().filter(|l| l.starts_with("ok")).count();
            Outcome {
                name,
                ok: out.status.success() && fails.is_empty() && checks > 0,
                numbers: Some(format!("{checks} checks passed")),
                why: if fails.is_empty() {
                    format!("exit {:?}: {}", out.status.code(), tail(&text))
                } else {
                    fails.join("; ")
                },
            }
        }
        Err(e) => Outcome {
            name,
            ok: false,
            numbers: None,
            why: format!("spawn: {e}"),
        },
    }
}
