//! The rdma_cm applications (rdmacm-utils, perftest's `-R`) on burst's
//! drop-in librdmacm: burst to burst over the veth pair, and against the
//! kernel's RDMA CM on RXE in the lab VM in both roles. rdma_cm servers
//! have no TCP port to probe, so readiness is signalled with files: the
//! VM touches `ready-N` in its shared state folder before it starts
//! server N; the host touches `host-ready-N` there once its server N has
//! its device open, and the VM's client N waits for it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::dropin::{report, spawn, tail, veth_setup, veth_teardown, Outcome};

/// One application pair. `{addr}` is the server's address, `{port}` the
/// case's port, `{local}` (client only) the client's own address.
pub struct CmCase {
    name: &'static str,
    server: &'static str,
    client: &'static str,
    /// A line the client prints when it passed.
    pass: &'static str,
    /// The server never ends by itself (cmtime): stopped after the client.
    endless: bool,
    /// The server first waits for its client on TCP `{port}` and opens
    /// its device only then (libfabric's fi_pingpong): ready when that
    /// port listens.
    oob: bool,
    /// What the client's output must also show, read from the embedded
    /// device's counters (the case is not run through burstd, whose port
    /// the client's environment does not reach).
    embedded_check: Option<fn(&str) -> bool>,
}

const fn case(
    name: &'static str,
    server: &'static str,
    client: &'static str,
    pass: &'static str,
) -> CmCase {
    CmCase {
        name,
        server,
        client,
        pass,
        endless: false,
        oob: false,
        embedded_check: None,
    }
}

/// A case whose server waits on TCP `{port}` first ([`CmCase::oob`]).
const fn oob_case(
    name: &'static str,
    server: &'static str,
    client: &'static str,
    pass: &'static str,
) -> CmCase {
    CmCase {
        oob: true,
        ..case(name, server, client, pass)
    }
}

/// rping's connected ping-pong, 10 rounds (IPv4 and IPv6 sets).
const RPING: CmCase = case(
    "rping -C 10",
    "rping -s -v -C 10 -a {addr} -p {port}",
    "rping -c -v -C 10 -a {addr} -p {port}",
    "rdma-ping-9:",
);

/// Every case.
pub const CASES: &[CmCase] = &[
    RPING,
    // The application readies its own QP (rdma_init_qp_attr, rdma_establish).
    case(
        "rping -q -C 10",
        "rping -s -q -v -C 10 -a {addr} -p {port}",
        "rping -c -q -v -C 10 -a {addr} -p {port}",
        "rdma-ping-9:",
    ),
    // udaddy's -p is the port space: its port is always 7174.
    case("udaddy", "udaddy", "udaddy -s {addr}", "test complete"),
    case(
        "ucmatose -c 4",
        "ucmatose -c 4 -p {port}",
        "ucmatose -s {addr} -c 4 -p {port}",
        "test complete",
    ),
    case(
        "rdma_server/rdma_client",
        "rdma_server -s {addr} -p {port}",
        "rdma_client -s {addr} -p {port}",
        "end 0",
    ),
    case(
        "ib_write_bw -R",
        "ib_write_bw -R -F -D 2 -s 65536 -p {port}",
        "ib_write_bw -R -F -D 2 -s 65536 -p {port} {addr}",
        "65536",
    ),
    case(
        "ib_send_lat -R",
        "ib_send_lat -R -F -n 1000 -p {port}",
        "ib_send_lat -R -F -n 1000 -p {port} {addr}",
        " 1000 ",
    ),
    case(
        "ib_read_bw -R",
        "ib_read_bw -R -F -D 2 -s 65536 -p {port}",
        "ib_read_bw -R -F -D 2 -s 65536 -p {port} {addr}",
        "65536",
    ),
    // libfabric's verbs provider (libfabric-bin): MSG endpoints straight
    // on rdma_cm; -B/-P its control port.
    oob_case(
        "fi_pingpong verbs msg",
        "fi_pingpong -p verbs -e msg -S 4096 -I 1000 -B {port}",
        "fi_pingpong -p verbs -e msg -S 4096 -I 1000 -P {port} {addr}",
        "=1k",
    ),
    // rdma_cm multicast: the server joins and receives 10 messages, the
    // client joins as a sender bound to its own address (the lab VM has
    // no route for the group) and sends them.
    case(
        "mckey (multicast)",
        "mckey -m 239.1.2.3 -b {addr}",
        "mckey -m 239.1.2.3 -s -b {local}",
        "test complete",
    ),
    // rsockets (librdmacm's stream sockets over RC): rstream's own data
    // check on both sides, non-blocking (its default) and blocking.
    case(
        RSTREAM,
        "rstream -b {addr} -p {port} -S 4096 -C 1000 -T v",
        "rstream -s {addr} -p {port} -S 4096 -C 1000 -T v",
        "custom",
    ),
    case(
        "rstream 64k x 200 blocking, verified",
        "rstream -b {addr} -p {port} -S 65536 -C 200 -T b -T v",
        "rstream -s {addr} -p {port} -S 65536 -C 200 -T b -T v",
        "custom",
    ),
    // rsockets' vector calls (rwritev/rreadv, rsendmsg/rrecvmsg) with an
    // empty buffer among three, both ways (built by `dropin::build`).
    case(
        RSOCKET_IOV,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/interop/rsocket-iov s {addr} {port}"
        ),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/interop/rsocket-iov c {addr} {port}"
        ),
        "rsocket-iov: ok",
    ),
    // riowrite into the peer's riomapped buffer (rsockets' direct
    // placement), the receiver watching its last byte.
    case(
        "riostream 4k x 1000, verified",
        "riostream -b {addr} -p {port} -S 4096 -C 1000 -T v",
        "riostream -s {addr} -p {port} -S 4096 -C 1000 -T v",
        "custom",
    ),
    // Its latency run at 64 bytes, as riostream runs it by default: each
    // side spins on its buffer's last byte, then writes its own value
    // there and sends the buffer back (a copy that stored that byte twice
    // put the peer's old value back: both sides hung).
    case(
        RIOSTREAM_LAT,
        "riostream -b {addr} -p {port} -S 64 -C 1 -I 2000",
        "riostream -s {addr} -p {port} -S 64 -C 1 -I 2000",
        "custom",
    ),
    CmCase {
        name: "cmtime (100 connections)",
        server: "cmtime -b {addr} -p {port}",
        client: "cmtime -s {addr} -p {port}",
        pass: "disconnect",
        endless: true,
        ..case("", "", "", "")
    },
];

/// burst to burst only (RXE's VM lacks nothing here, but these add little
/// against it).
pub const VETH_ONLY: &[CmCase] = &[
    // burst's ECE in the REQ and REP agrees on selective repeat, and the
    // drop-in's QPs must use it: with 1 packet in 100 dropped, the WRITE
    // target (rping's client) holds packets that arrive past a hole.
    CmCase {
        embedded_check: Some(held_past_a_hole),
        ..case(
            SELECTIVE,
            "env BURST_TEST_DROP=100 BURST_LOG=info rping -s -C 100 -S 60000 -a {addr} -p {port}",
            "env BURST_TEST_DROP=100 BURST_LOG=info rping -c -C 100 -S 60000 -a {addr} -p {port}",
            "packets held past a hole",
        )
    },
    // A client that exits right after rdma_disconnect: its CM ends with
    // it, so a lost DREQ is sent again before the process goes (with 1
    // packet in 3 dropped, the drop-in's fixed loss pattern loses it), or
    // the server waits for a disconnect forever (it did, 7 runs in 8).
    CmCase {
        embedded_check: Some(cm_line_at_exit),
        ..case(
            LOST_DREQ,
            "env BURST_TEST_DROP=3 rping -s -C 2 -S 100 -a {addr} -p {port}",
            "env BURST_TEST_DROP=3 BURST_LOG=info rping -c -C 2 -S 100 -a {addr} -p {port}",
            "CM at exit",
        )
    },
    // An unmodified TCP application on rsockets: librspreload (rdma-core's
    // LD_PRELOAD library, in librdmacm1) turns iperf3's TCP sockets into
    // rsockets. Without rsockets it would fall back to TCP on both sides
    // and pass anyway: the client's device must have sent the stream
    // (`rsockets_carried_it`). Against RXE (tried by hand, 2026-12-07): an
    // RXE client to a burst server passes; a burst client to an RXE server
    // fails in rdma-core's own rgetsockopt under iperf3's server ("stack
    // smashing detected" in the VM), so the case is burst to burst only.
    CmCase {
        embedded_check: Some(rsockets_carried_it),
        ..case(
            RSPRELOAD,
            "env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so iperf3 -s -1 -B {addr} -p {port}",
            "env BURST_LOG=info LD_PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so iperf3 -c {addr} -p {port} -t 2",
            "receiver",
        )
    },
    case(
        "rdma_xserver/rdma_xclient",
        "rdma_xserver -p {port}",
        "rdma_xclient -s {addr} -p {port}",
        "end 0",
    ),
    // rdma_migrate_id to a new event channel.
    case(
        "ucmatose -m",
        "ucmatose -m -p {port}",
        "ucmatose -m -s {addr} -p {port}",
        "test complete",
    ),
    // libfabric's RDM endpoints over verbs MSG ones (ofi_rxm); the ';'
    // would split the VM's shell line, so burst to burst only.
    oob_case(
        "fi_pingpong verbs;ofi_rxm rdm",
        "fi_pingpong -p verbs;ofi_rxm -e rdm -S 4096 -I 1000 -B {port}",
        "fi_pingpong -p verbs;ofi_rxm -e rdm -S 4096 -I 1000 -P {port} {addr}",
        "=1k",
    ),
    // One server process accepting 20 connections in turn from one client
    // process, each torn down before the next (built by `dropin::build`).
    case(
        CONSECUTIVE,
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/interop/cm-consecutive s {addr} 20 {port}"
        ),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/interop/cm-consecutive c {addr} 20 {port}"
        ),
        "client: connection 19 done",
    ),
];

/// Over IPv6 (burst to burst on the veth pair's fd00:198:18::/64
/// addresses): connected, datagram and multicast.
pub const V6_CASES: &[CmCase] = &[
    RPING,
    case(
        "udaddy",
        "udaddy -b {addr}",
        "udaddy -s {addr}",
        "test complete",
    ),
    case(
        "mckey (multicast)",
        "mckey -m ff0e::101 -b {addr}",
        "mckey -m ff0e::101 -s -b {local}",
        "test complete",
    ),
];

/// Over IPv6 against RXE (in the same boot of the VM as the IPv4 cases):
/// connected and datagram. Not mckey: RXE's own `mckey` cannot join
/// `ff0e::101` in the lab (return status -1 after "joining", as sender
/// and as receiver, before a packet of burst's matters).
pub fn rxe_v6_cases(quick: bool) -> &'static [CmCase] {
    if quick {
        &V6_CASES[..1]
    } else {
        &V6_CASES[..2]
    }
}

/// The rsockets cases in the CI share.
const RSTREAM: &str = "rstream 4k x 1000, verified";
const RSPRELOAD: &str = "iperf3 over librspreload (TCP sockets as rsockets)";
const RSOCKET_IOV: &str = "rsocket-iov (rwritev, rreadv, rsendmsg, rrecvmsg)";

/// The name of riostream's 64-byte latency case.
const RIOSTREAM_LAT: &str = "riostream 64 B latency x 2000";

/// The name of the consecutive-connections case (interop/cm-consecutive.c).
const CONSECUTIVE: &str = "20 consecutive connections, one process each side";

/// The name of the case that checks selective repeat agreed through rdma_cm.
const SELECTIVE: &str = "rping 60 KB, 1 in 100 dropped: selective repeat agreed by ECE";
const LOST_DREQ: &str = "rping -C 2, 1 in 3 dropped: the server still hears the disconnect";

/// Whether the client's CM printed its line at exit (it ended through
/// `exit`, where unanswered DREQs are sent again).
fn cm_line_at_exit(out: &str) -> bool {
    out.lines().any(|l| l.starts_with("burst: CM at exit"))
}

/// Whether the client's device sent a stream's worth of packets (its
/// rdma_cm exit line: `device A at exit: N packets sent`, N > 10,000).
fn rsockets_carried_it(out: &str) -> bool {
    out.lines().any(|l| {
        l.split(" at exit: ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 10_000)
    })
}

/// Whether the drop-in's exit line shows packets held past a hole
/// (`selective repeat: N packets held past a hole`, N > 0).
fn held_past_a_hole(out: &str) -> bool {
    out.lines().any(|l| {
        l.split("selective repeat: ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    })
}

/// The CI share against RXE: perftest's `-R` client connects its test QPs
/// right after its handshake, and an RXE server on the lab's emulated CPU
/// often listens again too late (REJ, reason 8: the race is perftest's),
/// so against an RXE server the quick set uses ucmatose instead.
pub fn quick_rxe(vm_serves: bool) -> Vec<&'static CmCase> {
    let perftest = if vm_serves {
        "ucmatose -c 4"
    } else {
        "ib_write_bw -R"
    };
    CASES
        .iter()
        .filter(|c| {
            matches!(
                c.name,
                "rping -C 10"
                    | "udaddy"
                    | "cmtime (100 connections)"
                    | "fi_pingpong verbs msg"
                    | "mckey (multicast)"
            ) || c.name == perftest
        })
        .collect()
}

/// The CI share: connected, datagram, perftest, connection rate,
/// consecutive connections, libfabric's verbs provider and rsockets.
pub fn quick() -> Vec<&'static CmCase> {
    CASES
        .iter()
        .chain(VETH_ONLY)
        .filter(|c| {
            matches!(
                c.name,
                "rping -C 10"
                    | "udaddy"
                    | "ib_write_bw -R"
                    | "cmtime (100 connections)"
                    | "fi_pingpong verbs msg"
                    | "mckey (multicast)"
            ) || c.name == CONSECUTIVE
                || c.name == SELECTIVE
                || c.name == LOST_DREQ
                || c.name == RSTREAM
                || c.name == RSPRELOAD
                || c.name == RSOCKET_IOV
                || c.name == RIOSTREAM_LAT
        })
        .collect()
}

/// `cases` narrowed to those whose name contains one of `only` (all when
/// `only` is empty).
pub fn narrowed<'a>(cases: Vec<&'a CmCase>, only: &[String]) -> Vec<&'a CmCase> {
    cases
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str())))
        .collect()
}

fn argv(template: &str, addr: &str, port: u16) -> String {
    template
        .replace("{addr}", addr)
        .replace("{port}", &port.to_string())
}

/// A client's command: [`argv`] and `{local}`, the client's own address.
fn client_argv(template: &str, addr: &str, port: u16, local: &str) -> String {
    argv(template, addr, port).replace("{local}", local)
}

/// Whether UDP 4791 is bound in namespace `ns` (a burst device is open).
fn roce_bound(ns: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hluln"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(":4791 "))
}

/// Whether TCP `port` listens in namespace `ns`.
fn tcp_listening(ns: &str, port: u16) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(":{port} ")))
}

/// Whether case `c`'s server in `ns` is ready for its client.
fn server_ready(c: &CmCase, ns: &str, port: u16) -> bool {
    if c.oob {
        tcp_listening(ns, port)
    } else {
        roce_bound(ns)
    }
}

fn wait_for(what: impl Fn() -> bool, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if what() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A burst process in namespace `ns` with address `addr`.
fn burst_argv(dir: &Path, ns: &str, addr: &str, cmd: &str, secs: u32) -> Vec<String> {
    burst_argv_on(dir, ns, addr, None, cmd, secs)
}

/// The same, a client of the burstd at `daemon` when there is one.
fn burst_argv_on(
    dir: &Path,
    ns: &str,
    addr: &str,
    daemon: Option<&Path>,
    cmd: &str,
    secs: u32,
) -> Vec<String> {
    let mut v: Vec<String> = ["ip", "netns", "exec", ns, "env"]
        .map(String::from)
        .to_vec();
    v.push(format!("BURST_ADDR={addr}"));
    if let Some(d) = daemon {
        v.push(format!("BURST_DAEMON={}", d.display()));
    }
    v.push(format!("LD_LIBRARY_PATH={}", dir.display()));
    v.extend(["timeout".into(), secs.to_string()]);
    v.extend(cmd.split_whitespace().map(String::from));
    v
}

fn outcome(name: String, ok: bool, numbers: Option<String>, why: String) -> Outcome {
    let o = Outcome {
        name,
        ok,
        numbers,
        why,
    };
    report(&o);
    o
}

/// The figure a passing client printed: perftest's row, cmtime's connect
/// line, else the line that says it passed.
fn numbers(c: &CmCase, out: &str) -> Option<String> {
    if c.endless {
        return cmtime_connect(out)
            .map(|(total_ms, per)| format!("connect {total_ms:.2} ms total, {per:.1} us/conn"));
    }
    out.lines()
        .rfind(|l| l.contains(c.pass))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// cmtime's connect row: (total ms, us per connection).
pub fn cmtime_connect(out: &str) -> Option<(f64, f64)> {
    let l = out.lines().find(|l| {
        let t = l.trim_start();
        t.starts_with("connect") && t.contains(':')
    })?;
    let f: Vec<f64> = l
        .split(':')
        .nth(1)?
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (f.len() >= 4).then(|| (f[0], f[3]))
}

/// burst to burst over the veth pair.
pub fn veth(dir: &Path, cases: &[&CmCase], base_port: u16, daemons: bool) -> Vec<Outcome> {
    veth_on(dir, cases, base_port, daemons, false)
}

/// [`V6_CASES`] burst to burst over the veth pair's IPv6 addresses.
pub fn veth_v6(dir: &Path, base_port: u16, daemons: bool) -> Vec<Outcome> {
    let cases: Vec<&CmCase> = V6_CASES.iter().collect();
    veth_on(dir, &cases, base_port, daemons, true)
}

fn veth_on(dir: &Path, cases: &[&CmCase], base_port: u16, daemons: bool, v6: bool) -> Vec<Outcome> {
    let mut out = Vec::new();
    if !veth_setup(1500) {
        let why = "ip netns failed".into();
        out.push(outcome("rdma_cm veth set-up".into(), false, None, why));
        return out;
    }
    let (sa, ca) = if v6 {
        // No duplicate address detection: usable at once.
        for (ns, dev, a) in [
            ("burstbb1", "bbveth1", "fd00:198:18::101/64"),
            ("burstbb2", "bbveth2", "fd00:198:18::102/64"),
        ] {
            let _ = Command::new("ip")
                .args(["-n", ns, "addr", "add", a, "dev", dev, "nodad"])
                .status();
        }
        ("fd00:198:18::101", "fd00:198:18::102")
    } else {
        ("198.18.0.101", "198.18.0.102")
    };
    let (da, db) = if daemons {
        (
            crate::dropin::start_daemon(Some("burstbb1"), sa, None),
            crate::dropin::start_daemon(Some("burstbb2"), ca, None),
        )
    } else {
        (None, None)
    };
    if daemons && (da.is_none() || db.is_none()) {
        let why = "burstd did not start".into();
        out.push(outcome("rdma_cm veth: burstd".into(), false, None, why));
        return out;
    }
    let sock_a = da.as_ref().map(|d| d.socket.as_path());
    let sock_b = db.as_ref().map(|d| d.socket.as_path());
    let via = match (daemons, v6) {
        (true, true) => " IPv6 via burstd",
        (true, false) => " via burstd",
        (false, true) => " IPv6",
        (false, false) => "",
    };
    for (i, c) in cases.iter().enumerate() {
        if daemons && c.embedded_check.is_some() {
            continue;
        }
        let port = base_port + i as u16;
        let name = format!("rdma_cm burst<->burst veth{via}: {}", c.name);
        let cmd = argv(c.server, sa, port);
        let server = match spawn(&burst_argv_on(dir, "burstbb1", sa, sock_a, &cmd, 60)) {
            Ok(s) => s,
            Err(e) => {
                out.push(outcome(name, false, None, format!("spawn: {e}")));
                continue;
            }
        };
        // The device opens at bind and the listen follows within
        // microseconds; burstd's port is bound already: a moment more.
        let up = wait_for(
            || server_ready(c, "burstbb1", port),
            Duration::from_secs(20),
        );
        std::thread::sleep(Duration::from_millis(if daemons { 1500 } else { 500 }));
        let mut server = server;
        let (mut cok, mut cout) = (false, "the server never opened its device".to_string());
        // A multicast receiver that joined after the sender's datagrams
        // went (its join through burstd under CI's load can outlast the
        // wait above) waits for them forever: what is checked is that it
        // gets them, so the sender sends again while it still waits.
        let tries = if c.name == "mckey (multicast)" { 3 } else { 1 };
        for t in 0..tries {
            if !up {
                break;
            }
            let cmd = client_argv(c.client, sa, port, ca);
            (cok, cout) = match spawn(&burst_argv_on(dir, "burstbb2", ca, sock_b, &cmd, 60)) {
                Ok(r) => r.wait(),
                Err(e) => (false, format!("spawn: {e}")),
            };
            if !cok || t + 1 == tries || !server.running_after(Duration::from_secs(5)) {
                break;
            }
            println!("xtask: {name}: the receiver still waits; sending again");
        }
        let (sok, sout) = if c.endless || !cok {
            let (_, s) = server.stop();
            (true, s)
        } else {
            server.wait()
        };
        let nums = numbers(c, &cout);
        let ok = cok && sok && nums.is_some() && c.embedded_check.is_none_or(|f| f(&cout));
        let why = if ok {
            String::new()
        } else {
            tail(&(cout + " / server: " + &sout))
        };
        out.push(outcome(name, ok, nums, why));
    }
    drop((da, db));
    veth_teardown();
    out
}

/// Against RXE in the lab VM; `vm_serves`: the VM runs the servers.
/// `cases` over IPv4, then `v6_cases` over IPv6 ([`crate::dropin::LAB_V6`])
/// in the same boot.
pub fn rxe(
    root: &Path,
    dir: &Path,
    cases: &[&CmCase],
    v6_cases: &[CmCase],
    vm_serves: bool,
    base_port: u16,
) -> Vec<Outcome> {
    let lab = root.join("../shared/rxe-lab/rxe-vm");
    let state = Path::new("/run/rxe-lab/run-a");
    let label = if vm_serves {
        "rdma_cm burst client -> RXE server"
    } else {
        "rdma_cm RXE client -> burst server"
    };
    // Each case with its family: (case, IPv6).
    let cases: Vec<(&CmCase, bool)> = cases
        .iter()
        .map(|c| (*c, false))
        .chain(v6_cases.iter().map(|c| (c, true)))
        .collect();
    // (VM, host) addresses of a case.
    let ips = |v6: bool| {
        if v6 {
            (crate::dropin::LAB_V6.1, crate::dropin::LAB_V6.0)
        } else {
            ("198.18.0.2", "198.18.0.1")
        }
    };
    let _ = Command::new("bash").arg(&lab).arg("setup").status();
    if !v6_cases.is_empty() {
        crate::dropin::lab_v6_host();
    }
    let _ = std::fs::create_dir_all(state);
    for i in 0..cases.len() {
        let _ = std::fs::remove_file(state.join(format!("ready-{i}")));
        let _ = std::fs::remove_file(state.join(format!("host-ready-{i}")));
        let _ = std::fs::remove_file(state.join(format!("done-{i}")));
    }
    let mut script = String::new();
    if !v6_cases.is_empty() {
        script.push_str(&crate::dropin::lab_v6_vm());
    }
    for (i, &(c, v6)) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        let (vm_ip, host_ip) = ips(v6);
        let server_ip = if vm_serves { vm_ip } else { host_ip };
        let (before, t, cmd, after) = if vm_serves {
            (
                format!("touch $RXE_LAB_STATE/ready-{i}"),
                if c.endless { 40 } else { 90 },
                argv(c.server, server_ip, port),
                "true".to_string(),
            )
        } else {
            (
                format!("for t in $(seq 1 600); do [ -e $RXE_LAB_STATE/host-ready-{i} ] && break; sleep 0.2; done"),
                90,
                client_argv(c.client, server_ip, port, vm_ip),
                format!("touch $RXE_LAB_STATE/done-{i}"),
            )
        };
        script.push_str(&format!(
            "{before}; timeout {t} {cmd} > /tmp/cm{i}.log 2>&1; rc=$?; {after}; echo VMRESULT {i} $rc; tail -n 12 /tmp/cm{i}.log | sed 's/^/VMLOG {i} /'; "
        ));
    }
    crate::dropin::wait_lab_slot("run-a");
    let vm = match spawn(&[
        "bash".into(),
        lab.to_string_lossy().into_owned(),
        "run".into(),
        "--timeout".into(),
        (300 + 120 * cases.len()).to_string(),
        "--".into(),
        script,
    ]) {
        Ok(v) => v,
        Err(e) => return vec![outcome(label.into(), false, None, format!("VM: {e}"))],
    };
    let mut host: Vec<(bool, String)> = Vec::new();
    for (i, &(c, v6)) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        let (vm_ip, host_ip) = ips(v6);
        let r = if vm_serves {
            let ready = state.join(format!("ready-{i}"));
            if wait_for(|| ready.exists(), Duration::from_secs(400)) {
                // The server starts after the file, on a slow emulated CPU:
                // a client that fails fast (rejected: nothing listens yet)
                // tries again.
                let mut r = (false, String::new());
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_secs(6));
                    let t = Instant::now();
                    let argv = burst_argv(
                        dir,
                        "burstlab",
                        host_ip,
                        &client_argv(c.client, vm_ip, port, host_ip),
                        90,
                    );
                    r = match spawn(&argv) {
                        Ok(r) => r.wait(),
                        Err(e) => (false, format!("spawn: {e}")),
                    };
                    if r.0 || t.elapsed() > Duration::from_secs(10) {
                        break;
                    }
                }
                r
            } else {
                (false, "the VM never started the server".into())
            }
        } else {
            match spawn(&burst_argv(
                dir,
                "burstlab",
                host_ip,
                &argv(c.server, host_ip, port),
                400,
            )) {
                Ok(s) => {
                    let up = wait_for(
                        || server_ready(c, "burstlab", port),
                        Duration::from_secs(20),
                    );
                    std::thread::sleep(Duration::from_millis(500));
                    let _ = std::fs::write(state.join(format!("host-ready-{i}")), "");
                    if !up {
                        s.stop()
                    } else if c.endless {
                        // Until the VM's client has ended.
                        let done = state.join(format!("done-{i}"));
                        let _ = wait_for(|| done.exists(), Duration::from_secs(150));
                        s.stop()
                    } else {
                        s.wait()
                    }
                }
                Err(e) => (false, format!("spawn: {e}")),
            }
        };
        host.push(r);
    }
    let (_, vm_out) = vm.wait();
    let mut out = Vec::new();
    for (i, &(c, v6)) in cases.iter().enumerate() {
        let rc = vm_out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("VMRESULT {i} ")))
            .map(|r| r.trim().to_string());
        let vm_log: Vec<&str> = vm_out
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("VMLOG {i} ")))
            .collect();
        let vm_log = vm_log.join("\n");
        let (hok, hout) = &host[i];
        // The endless server (cmtime) is stopped: its status says nothing.
        let vm_ok =
            rc.as_deref() == Some("0") || (c.endless && vm_serves && rc.as_deref() == Some("124"));
        let host_ok = *hok || (c.endless && !vm_serves);
        let client_out = if vm_serves {
            hout.as_str()
        } else {
            vm_log.as_str()
        };
        let nums = numbers(c, client_out);
        let ok = vm_ok && host_ok && nums.is_some();
        let why = if ok {
            String::new()
        } else {
            format!(
                "burst: {} / RXE exit {}: {}",
                tail(hout),
                rc.as_deref().unwrap_or("none"),
                tail(&vm_log)
            )
        };
        let family = if v6 { " IPv6" } else { "" };
        out.push(outcome(
            format!("{label}{family}: {}", c.name),
            ok,
            nums,
            why,
        ));
    }
    out
}
