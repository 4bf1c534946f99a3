//! `cargo xtask daemon [--quick]`: burstd over the veth pair, one daemon per
//! side, unmodified perftest and rdma-core tools as its clients.
//!
//! - several applications at once through one burstd per side, on one
//!   address per side (ib_write_bw, ib_send_lat, ibv_rc_pingpong -c);
//! - SIGKILL of an application mid-transfer: its objects go (timed through
//!   the `burst` tool), the other pair's transfer completes with its data
//!   checked, the daemon's descriptors return to their baseline;
//! - SIGKILL of burstd during ib_write_bw: the application ends (timed);
//! - without `--quick`, the numbers: write_bw 64 KiB and send_lat 64 B
//!   through burstd against embedded mode, and the aggregate bandwidth of
//!   1, 2, 4 and 8 pairs sharing one burstd per side.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::dropin::{veth_setup, veth_teardown, wait_listen, Outcome};

const NS: [&str; 2] = ["burstbb1", "burstbb2"];
const ADDR: [&str; 2] = ["198.18.0.101", "198.18.0.102"];

/// The GID index of [`ADDR`] on its veth: 0 is the link-local default GID,
/// 1 the veth's one IPv4 address (as RXE lists them); checked against the
/// table burstd reports before the cases run (in [`run`]).
const VETH_GID_INDEX: &str = "1";

/// A process whose output is gathered in the background.
struct Proc {
    child: Child,
    out: std::thread::JoinHandle<String>,
}

/// Runs `argv` with `env` in namespace `ns` (or this one), its output
/// gathered in the background. `ip netns exec` and `env` exec into the
/// tool: the child's PID is the tool's own, so a SIGKILL reaches the
/// application itself.
fn spawn_in(ns: Option<&str>, env: &[(String, String)], argv: &[String]) -> std::io::Result<Proc> {
    let mut c = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", n, "env"]);
            c
        }
        None => Command::new("env"),
    };
    for (k, v) in env {
        c.arg(format!("{k}={v}"));
    }
    let mut child = c
        .args(argv)
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
    Ok(Proc { child, out })
}

/// [`spawn_in`] a namespace.
fn spawn(ns: &str, env: &[(String, String)], argv: &[String]) -> std::io::Result<Proc> {
    spawn_in(Some(ns), env, argv)
}

impl Proc {
    /// Waits at most `within`; kills it past that.
    fn wait(mut self, within: Duration) -> (bool, String) {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return (s.success(), self.out.join().unwrap_or_default()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let out = self.out.join().unwrap_or_default();
                    return (false, format!("timed out: {}", tail(&out)));
                }
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (a burstd then detaches its XDP program and closes its
    /// port), SIGKILL after 5 s.
    fn term(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// One burstd per side.
struct Daemons {
    procs: Vec<Proc>,
    sockets: [PathBuf; 2],
    bin: PathBuf,
}

impl Daemons {
    fn start(root: &Path) -> Result<Daemons, String> {
        let dir = std::env::temp_dir().join("burst-xtask-daemon");
        let _ = std::fs::create_dir_all(&dir);
        let mut d = Daemons {
            procs: Vec::new(),
            sockets: [dir.join("side1.sock"), dir.join("side2.sock")],
            bin: root.join("target/release"),
        };
        for side in 0..2 {
            d.start_side(side)?;
        }
        Ok(d)
    }

    fn start_side(&mut self, side: usize) -> Result<(), String> {
        let sock = &self.sockets[side];
        let _ = std::fs::remove_file(sock);
        let argv = vec![
            self.bin.join("burstd").display().to_string(),
            "--addr".into(),
            ADDR[side].into(),
            "--socket".into(),
            sock.display().to_string(),
        ];
        let env = vec![("BURST_LOG".to_string(), "warn".to_string())];
        let p = spawn(NS[side], &env, &argv).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            if Instant::now() > deadline {
                return Err(format!("burstd on {} did not start", ADDR[side]));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if side < self.procs.len() {
            self.procs[side] = p;
        } else {
            self.procs.push(p);
        }
        Ok(())
    }

    fn pid(&self, side: usize) -> u32 {
        self.procs[side].child.id()
    }

    /// `burst clients` on a side: the pids it lists.
    fn client_pids(&self, side: usize) -> Vec<u32> {
        let o = Command::new(self.bin.join("burst"))
            .args(["clients", "--socket"])
            .arg(&self.sockets[side])
            .output();
        let Ok(o) = o else { return Vec::new() };
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == "client").then_some(())?;
                f.nth(2)?.parse().ok()
            })
            .collect()
    }

    fn stop(mut self) {
        for p in &mut self.procs {
            p.term();
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The environment of a tool on `side`: burstd's socket, or (embedded)
/// the side's address.
fn tool_env(libdir: &Path, d: &Daemons, side: usize, daemon: bool) -> Vec<(String, String)> {
    let mut v = vec![("LD_LIBRARY_PATH".to_string(), libdir.display().to_string())];
    if daemon {
        v.push(("BURST_DAEMON".into(), d.sockets[side].display().to_string()));
    } else {
        v.push(("BURST_ADDR".into(), ADDR[side].into()));
    }
    v
}

/// A tool's arguments, with burst's GID index for an address of the veths.
fn argv(tool: &str, args: &str, port: u16, peer: Option<&str>) -> Vec<String> {
    argv_gid(tool, args, VETH_GID_INDEX, port, peer)
}

/// A tool's arguments with GID index `gid`.
fn argv_gid(tool: &str, args: &str, gid: &str, port: u16, peer: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> = vec![tool.into(), "-d".into(), "burst0".into()];
    v.push(if tool.starts_with("ibv_") { "-g" } else { "-x" }.into());
    v.push(gid.into());
    v.extend(args.split_whitespace().map(String::from));
    v.push("-p".into());
    v.push(port.to_string());
    v.extend(peer.map(String::from));
    v
}

/// The last row of numbers perftest prints, or the pingpong's result line.
fn result(out: &str) -> Option<String> {
    out.lines()
        .find(|l| l.contains(" iters in "))
        .map(|l| l.trim().to_string())
        .or_else(|| {
            out.lines()
                .rfind(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() >= 4 && f.iter().all(|x| x.parse::<f64>().is_ok())
                })
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
}

/// Servers on side 1, clients on side 2, all at once; one outcome each.
fn concurrent(
    libdir: &Path,
    d: &Daemons,
    daemon: bool,
    cases: &[(&str, &str, &str)],
    base_port: u16,
) -> Vec<(String, bool, String)> {
    let mut servers = Vec::new();
    for (i, (_, tool, args)) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        match spawn(
            NS[0],
            &tool_env(libdir, d, 0, daemon),
            &argv(tool, args, port, None),
        ) {
            Ok(p) => servers.push(Some(p)),
            Err(_) => servers.push(None),
        }
    }
    for i in 0..cases.len() {
        wait_listen(Some(NS[0]), base_port + i as u16, Duration::from_secs(20));
    }
    let mut clients = Vec::new();
    for (i, (_, tool, args)) in cases.iter().enumerate() {
        let port = base_port + i as u16;
        clients.push(
            spawn(
                NS[1],
                &tool_env(libdir, d, 1, daemon),
                &argv(tool, args, port, Some(ADDR[0])),
            )
            .ok(),
        );
    }
    let mut out = Vec::new();
    for (i, (name, _, _)) in cases.iter().enumerate() {
        let (cok, cout) = clients[i]
            .take()
            .map_or((false, "spawn failed".into()), |c| {
                c.wait(Duration::from_secs(120))
            });
        let (sok, sout) = servers[i]
            .take()
            .map_or((false, "spawn failed".into()), |s| {
                s.wait(Duration::from_secs(20))
            });
        let r = result(&cout);
        let ok = cok && sok && r.is_some();
        out.push((
            name.to_string(),
            ok,
            if ok {
                r.unwrap_or_default()
            } else {
                tail(&(cout + " | " + &sout))
            },
        ));
    }
    out
}

fn outcome(name: &str, ok: bool, numbers: Option<String>, why: String) -> Outcome {
    let o = Outcome {
        name: name.into(),
        ok,
        numbers,
        why,
    };
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
    o
}

/// Several tools at once through one burstd per side.
fn shared(libdir: &Path, d: &Daemons) -> Vec<Outcome> {
    let cases = [
        (
            "ib_write_bw 64 KiB",
            "ib_write_bw",
            "-s 65536 -n 2000 --report_gbits",
        ),
        ("ib_send_lat 64 B", "ib_send_lat", "-s 64 -n 2000"),
        (
            "ibv_rc_pingpong 4 KiB -c",
            "ibv_rc_pingpong",
            "-s 4096 -n 2000 -c",
        ),
    ];
    concurrent(libdir, d, true, &cases, 23000)
        .into_iter()
        .map(|(n, ok, r)| {
            outcome(
                &format!("burstd: at once: {n}"),
                ok,
                ok.then(|| r.clone()),
                r,
            )
        })
        .collect()
}

/// Two children of one parent that had listed the devices connect to
/// each other through rdma_cm on the one burstd (interop/cm-fork.c).
fn forked(root: &Path, libdir: &Path, d: &Daemons) -> Vec<Outcome> {
    let name =
        "burstd: two forked children of a parent that listed the devices connect through rdma_cm";
    let bin = root.join("target/interop/cm-fork");
    let argv = vec![
        "timeout".to_string(),
        "30".into(),
        bin.display().to_string(),
        ADDR[0].into(),
        "7499".into(),
    ];
    let r =
        spawn(NS[0], &tool_env(libdir, d, 0, true), &argv).map(|p| p.wait(Duration::from_secs(40)));
    let (ok, out) = match r {
        Ok((ok, out)) => (
            ok && out.contains("server: established") && out.contains("client: established"),
            out,
        ),
        Err(e) => (false, e.to_string()),
    };
    vec![outcome(
        name,
        ok,
        ok.then(|| "both established".into()),
        tail(&out),
    )]
}

/// rdma-core's test suite ([`crate::dropin::rdma_core_suite`]) through
/// burstd, under `burst run` so that it finds the device's sysfs files and
/// interface: the verbs, the CQ events, MRs and MWs, the extended QP and CQ
/// APIs, and the rdma_cm cases, whose two players are processes forked from
/// the runner (which embedded mode cannot serve).
fn rdma_core_tests(root: &Path, libdir: &Path, d: &Daemons) -> Vec<Outcome> {
    let name = "burstd: rdma-core's test suite (pyverbs) passes, every case of a RoCE device run";
    let dir = match crate::dropin::rdma_core_suite(root) {
        Ok(dir) => dir,
        Err(why) => return vec![outcome(name, false, None, why)],
    };
    let argv = vec![
        "timeout".to_string(),
        "600".into(),
        root.join("target/release/burst").display().to_string(),
        "run".into(),
        "--".into(),
        "/usr/bin/python3".into(),
        dir.join("run_tests.py").display().to_string(),
        "-v".into(),
    ];
    let r = spawn(NS[0], &tool_env(libdir, d, 0, true), &argv)
        .map(|p| p.wait(Duration::from_secs(660)));
    let (ok, out) = r.unwrap_or_else(|e| (false, e.to_string()));
    let o = crate::dropin::rdma_core_outcome(name, ok, &out, crate::dropin::RDMA_CORE_RUN);
    vec![outcome(&o.name, o.ok, o.numbers, o.why)]
}

/// SIGKILL of an application in the middle of a transfer.
fn kill_app(libdir: &Path, d: &Daemons) -> Vec<Outcome> {
    let mut out = Vec::new();
    let pid = d.pid(0);
    // Let the daemon settle before the baseline (no client).
    std::thread::sleep(Duration::from_millis(300));
    let (fds0, rss0) = (fd_count(pid), rss_kib(pid));
    let port_k = 23100;
    let port_v = 23101;
    let env0 = tool_env(libdir, d, 0, true);
    let env1 = tool_env(libdir, d, 1, true);
    let victim_s = spawn(
        NS[0],
        &env0,
        &argv("ib_write_bw", "-s 65536 -D 30", port_k, None),
    );
    let verified_s = spawn(
        NS[0],
        &env0,
        &argv("ibv_rc_pingpong", "-s 4096 -n 30000 -c", port_v, None),
    );
    wait_listen(Some(NS[0]), port_k, Duration::from_secs(20));
    wait_listen(Some(NS[0]), port_v, Duration::from_secs(20));
    let victim_c = spawn(
        NS[1],
        &env1,
        &argv("ib_write_bw", "-s 65536 -D 30", port_k, Some(ADDR[0])),
    );
    let verified_c = spawn(
        NS[1],
        &env1,
        &argv(
            "ibv_rc_pingpong",
            "-s 4096 -n 30000 -c",
            port_v,
            Some(ADDR[0]),
        ),
    );
    let (Ok(mut vs), Ok(vfs), Ok(mut vc), Ok(vfc)) = (victim_s, verified_s, victim_c, verified_c)
    else {
        out.push(outcome(
            "burstd: SIGKILL of an application",
            false,
            None,
            "spawn failed".into(),
        ));
        return out;
    };
    std::thread::sleep(Duration::from_secs(2));
    let victim = vs.child.id();
    let listed = d.client_pids(0).contains(&victim);
    let t0 = Instant::now();
    vs.kill();
    let mut gone = None;
    while t0.elapsed() < Duration::from_secs(5) {
        if !d.client_pids(0).contains(&victim) {
            gone = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    vc.kill();
    let (okc, outc) = vfc.wait(Duration::from_secs(120));
    let (oks, outs) = vfs.wait(Duration::from_secs(20));
    out.push(outcome(
        "burstd: SIGKILL of ib_write_bw mid-transfer: its objects destroyed (burst clients)",
        listed && gone.is_some(),
        gone.map(|g| {
            format!(
                "gone from `burst clients` {:.1} ms after the kill (polled)",
                g.as_secs_f64() * 1e3
            )
        }),
        format!("listed before: {listed}, gone: {gone:?}"),
    ));
    let r = result(&outc);
    out.push(outcome(
        "burstd: the other pair (ibv_rc_pingpong -c, data checked) completes",
        okc && oks && r.is_some(),
        r,
        tail(&(outc + " | " + &outs)),
    ));
    // Back to the baseline once every client is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fd_count(pid) != fds0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (fds1, rss1) = (fd_count(pid), rss_kib(pid));
    out.push(outcome(
        "burstd: descriptors back to the baseline after the clients left",
        fds1 == fds0,
        Some(format!(
            "fds {fds0} -> {fds1}; RSS {rss0} KiB -> {rss1} KiB"
        )),
        format!("fds {fds0} -> {fds1}"),
    ));
    out
}

/// SIGKILL of burstd during ib_write_bw: its application must end. The
/// daemon killed is the client side's, where ib_write_bw posts and polls;
/// the passive server calls no verb during the test (it waits on its TCP
/// socket), so only its async fd (DEVICE_FATAL) could tell it.
fn kill_daemon(libdir: &Path, d: &mut Daemons) -> Vec<Outcome> {
    let port = 23200;
    let env0 = tool_env(libdir, d, 0, true);
    let env1 = tool_env(libdir, d, 1, true);
    let s = spawn(
        NS[0],
        &env0,
        &argv("ib_write_bw", "-s 65536 -D 30", port, None),
    );
    wait_listen(Some(NS[0]), port, Duration::from_secs(20));
    let c = spawn(
        NS[1],
        &env1,
        &argv("ib_write_bw", "-s 65536 -D 30", port, Some(ADDR[0])),
    );
    let (Ok(mut s), Ok(mut c)) = (s, c) else {
        return vec![outcome(
            "burstd: SIGKILL of burstd",
            false,
            None,
            "spawn failed".into(),
        )];
    };
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    d.procs[1].kill();
    let mut ended = None;
    while t0.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = c.child.try_wait() {
            ended = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    s.kill();
    c.kill();
    let restarted = d.start_side(1).is_ok();
    let ok = ended.is_some_and(|e| e <= Duration::from_secs(1)) && restarted;
    vec![outcome(
        "burstd: SIGKILL of the sender's burstd during ib_write_bw: ib_write_bw ends, a new burstd starts",
        ok,
        ended.map(|e| {
            format!(
                "the application ended {:.0} ms after the kill",
                e.as_secs_f64() * 1e3
            )
        }),
        format!("ended: {ended:?}, restarted: {restarted}"),
    )]
}

fn gbits(r: &str) -> Option<f64> {
    // ib_write_bw --report_gbits: bytes iters peak avg msgrate.
    r.split_whitespace().nth(3)?.parse().ok()
}

fn typical_us(r: &str) -> Option<f64> {
    // ib_send_lat: bytes iters min max typical ...
    r.split_whitespace().nth(4)?.parse().ok()
}

/// The numbers: daemon against embedded, and pairs sharing one burstd.
/// Embedded rounds run with the daemons stopped: an embedded engine binds
/// the address's UDP port 4791, which burstd holds.
fn numbers(libdir: &Path, d: &mut Daemons, rounds: usize) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut bw = [Vec::new(), Vec::new()];
    let mut lat = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (k, daemon) in [true, false].into_iter().enumerate() {
            if !daemon {
                for p in &mut d.procs {
                    p.kill();
                }
            }
            let port = 23300 + (round * 10 + k * 4) as u16;
            let r = concurrent(
                libdir,
                d,
                daemon,
                &[("write_bw", "ib_write_bw", "-s 65536 -D 4 --report_gbits")],
                port,
            );
            if let Some(g) = r.first().filter(|x| x.1).and_then(|x| gbits(&x.2)) {
                bw[k].push(g);
            } else {
                eprintln!(
                    "xtask: write_bw (daemon: {daemon}) failed: {:?}",
                    r.first().map(|x| &x.2)
                );
            }
            let r = concurrent(
                libdir,
                d,
                daemon,
                &[("send_lat", "ib_send_lat", "-s 64 -n 5000")],
                port + 2,
            );
            if let Some(t) = r.first().filter(|x| x.1).and_then(|x| typical_us(&x.2)) {
                lat[k].push(t);
            } else {
                eprintln!(
                    "xtask: send_lat (daemon: {daemon}) failed: {:?}",
                    r.first().map(|x| &x.2)
                );
            }
            if !daemon {
                for side in 0..2 {
                    if let Err(e) = d.start_side(side) {
                        eprintln!("xtask: {e}");
                    }
                }
            }
        }
    }
    let med = |v: &[f64]| crate::dropin::median(v);
    let ok = bw.iter().all(|v| !v.is_empty()) && lat.iter().all(|v| !v.is_empty());
    out.push(outcome(
        "burstd vs embedded: ib_write_bw 64 KiB (Gb/s) and ib_send_lat 64 B (typical us), veth MTU 9000",
        ok,
        ok.then(|| {
            format!(
                "write_bw daemon {:.2} embedded {:.2} ratio {:.2}; send_lat daemon {:.2} embedded {:.2} ratio {:.2}; {rounds} rounds, medians; daemon {:?} {:?} embedded {:?} {:?}",
                med(&bw[0]),
                med(&bw[1]),
                med(&bw[0]) / med(&bw[1]),
                med(&lat[0]),
                med(&lat[1]),
                med(&lat[0]) / med(&lat[1]),
                bw[0], lat[0], bw[1], lat[1]
            )
        }),
        "a run failed".into(),
    ));
    let mut agg = Vec::new();
    for (k, n) in [1usize, 2, 4, 8].into_iter().enumerate() {
        let cases: Vec<(&str, &str, &str)> = (0..n)
            .map(|_| ("write_bw", "ib_write_bw", "-s 65536 -D 4 --report_gbits"))
            .collect();
        let r = concurrent(libdir, d, true, &cases, 23400 + (k * 10) as u16);
        let all = r.iter().all(|x| x.1);
        let sum: f64 = r.iter().filter_map(|x| gbits(&x.2)).sum();
        agg.push((n, all, sum));
    }
    let ok = agg.iter().all(|a| a.1);
    out.push(outcome(
        "burstd: aggregate ib_write_bw 64 KiB of 1, 2, 4, 8 pairs through one burstd per side (Gb/s)",
        ok,
        Some(
            agg.iter()
                .map(|(n, _, s)| format!("{n} pairs {s:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        "a pair failed".into(),
    ));
    out
}

/// burstd over the kernel-bypass ports: AF_XDP on the veth pair (each
/// daemon on its side's interface) and DPDK net_memif (two daemons joined by
/// a memif socket, their own addresses 198.18.0.201/202, the tools' TCP on
/// loopback); ib_write_bw and ibv_rc_pingpong -c through each.
fn bypass(root: &Path, libdir: &Path) -> Vec<Outcome> {
    let mut out = Vec::new();
    let bin = root.join("target/release");
    let dir = std::env::temp_dir().join("burst-xtask-daemon");
    let socks = [dir.join("bypass1.sock"), dir.join("bypass2.sock")];
    let cases = [
        (
            "ib_write_bw 64 KiB",
            "ib_write_bw",
            "-s 65536 -n 2000 --report_gbits",
        ),
        (
            "ibv_rc_pingpong 4 KiB -c",
            "ibv_rc_pingpong",
            "-s 4096 -n 1000 -c",
        ),
    ];
    let memif = dir.join("memif.sock");
    for kind in ["af-xdp", "dpdk"] {
        // A socket file left by a killed memif server makes the next fail.
        let _ = std::fs::remove_file(&memif);
        let mut daemons = Vec::new();
        for side in 0..2 {
            let _ = std::fs::remove_file(&socks[side]);
            let mut argv = vec![bin.join("burstd").display().to_string()];
            let mut env = vec![("BURST_LOG".to_string(), "warn".to_string())];
            let ns = if kind == "af-xdp" {
                argv.extend(["--iface".into(), format!("bbveth{}", side + 1)]);
                argv.extend(["--port".into(), "af-xdp".into()]);
                Some(NS[side])
            } else {
                let (role, cpu) = if side == 0 {
                    ("server", 1)
                } else {
                    ("client", 0)
                };
                env.push((
                    "BURST_DPDK".into(),
                    format!(
                        "--lcores=0@{cpu} --vdev=net_memif0,role={role},socket={},socket-abstract=no device=net_memif0",
                        memif.display()
                    ),
                ));
                argv.extend(["--addr".into(), format!("198.18.0.20{}", side + 1)]);
                argv.extend(["--port".into(), "dpdk".into()]);
                None
            };
            argv.extend(["--socket".into(), socks[side].display().to_string()]);
            let p = spawn_in(ns, &env, &argv);
            if let Ok(p) = p {
                daemons.push(p);
            }
            // The memif server listens before its client starts.
            std::thread::sleep(Duration::from_millis(500));
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while !(socks[0].exists() && socks[1].exists()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (i, (name, tool, args)) in cases.iter().enumerate() {
            let port = 23500 + i as u16 + if kind == "dpdk" { 10 } else { 0 };
            let env = |side: usize| {
                vec![
                    ("LD_LIBRARY_PATH".to_string(), libdir.display().to_string()),
                    (
                        "BURST_DAEMON".to_string(),
                        socks[side].display().to_string(),
                    ),
                ]
            };
            let (peer, ns): (&str, [Option<&str>; 2]) = if kind == "af-xdp" {
                (ADDR[0], [Some(NS[0]), Some(NS[1])])
            } else {
                ("127.0.0.1", [None, None])
            };
            let run = |side: usize, argv: &[String]| spawn_in(ns[side], &env(side), argv);
            // A DPDK port's address is on no interface: its GID is at 0.
            let gid = if kind == "dpdk" { "0" } else { VETH_GID_INDEX };
            let s = run(0, &argv_gid(tool, args, gid, port, None));
            crate::dropin::wait_listen(ns[0], port, Duration::from_secs(20));
            let c = run(1, &argv_gid(tool, args, gid, port, Some(peer)));
            let (cok, cout) = c.map_or((false, "spawn failed".into()), |c| {
                c.wait(Duration::from_secs(90))
            });
            let (sok, sout) = s.map_or((false, "spawn failed".into()), |s| {
                s.wait(Duration::from_secs(20))
            });
            let r = result(&cout);
            let ok = cok && sok && r.is_some();
            out.push(outcome(
                &format!("burstd over {kind}: {name}"),
                ok,
                r,
                tail(&(cout + " | " + &sout)),
            ));
        }
        for mut d in daemons {
            d.term();
        }
    }
    out
}

/// Builds burstd, the tool, the drop-in; runs everything over the veth pair.
pub fn run(root: &Path, quick: bool) -> Vec<Outcome> {
    let mut out = Vec::new();
    let built = Command::new("cargo")
        .current_dir(root)
        .args(["build", "--release", "-p", "burstd"])
        .status()
        .is_ok_and(|s| s.success());
    let libdir = crate::dropin::build(root);
    let (true, Some(libdir)) = (built, libdir) else {
        out.push(outcome(
            "burstd: build",
            false,
            None,
            "cargo build failed".into(),
        ));
        return out;
    };
    // A fresh pair: no XDP program left attached by an earlier run.
    veth_teardown();
    if !veth_setup(9000) {
        out.push(outcome(
            "burstd: veth set-up",
            false,
            None,
            "ip netns failed".into(),
        ));
        return out;
    }
    let mut d = match Daemons::start(root) {
        Ok(d) => d,
        Err(e) => {
            out.push(outcome("burstd: start", false, None, e));
            veth_teardown();
            return out;
        }
    };
    // The GID table through burstd, as `ibv_devinfo -v` reads it.
    let gid = crate::dropin::burst_gid_index(Some(NS[0]), &tool_env(&libdir, &d, 0, true), ADDR[0]);
    out.push(outcome(
        "burstd: GID table lists the veth's IPv4 address at index 1 (as RXE)",
        gid == VETH_GID_INDEX,
        Some(format!("GID index {gid}")),
        format!("ibv_devinfo -v lists {} at index {gid}", ADDR[0]),
    ));
    out.extend(shared(&libdir, &d));
    out.extend(forked(root, &libdir, &d));
    out.extend(rdma_core_tests(root, &libdir, &d));
    out.extend(kill_app(&libdir, &d));
    out.extend(kill_daemon(&libdir, &mut d));
    if !quick {
        out.extend(numbers(&libdir, &mut d, 3));
    }
    d.stop();
    // The kernel-bypass ports, when burstd builds with them (clang, libbpf,
    // libdpdk-dev: what `cargo xtask test` installs as root).
    let bypass_built = Command::new("cargo")
        .current_dir(root)
        .args([
            "build",
            "--release",
            "-p",
            "burstd",
            "--features",
            "af-xdp,dpdk",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if bypass_built {
        out.extend(bypass(root, &libdir));
    } else {
        println!("xtask: burstd over AF_XDP and DPDK skipped (the features do not build here)");
    }
    veth_teardown();
    out
}
