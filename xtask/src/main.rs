//! Project automation. `cargo xtask test` is the one test entry point: the
//! README and `.ci/run` both call it.

mod bench;
mod cm;
mod congestion;
mod daemon;
mod dataplanes;
mod dropin;
mod kvbench;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask test [--no-fuzz] [--fuzz-secs N]
       cargo xtask interop [--quick] [--examples-only WORD] [--ucx-only] [--port udp|af-xdp|af-xdp-generic|dpdk] [--daemon]
       cargo xtask bench [--rounds N] [--secs S] [--no-sweep]
       cargo xtask sweep [--seeds N] [--first-seed S] [--secs S] [--copy BACKEND]
       cargo xtask dropin [--loopback] [--veth] [--rxe] [--v6] [--numbers] [--quick] [--only WORD]... [--port udp|af-xdp|af-xdp-generic|dpdk] [--daemon]
       cargo xtask congestion [FLOWS]...
       cargo xtask dataplanes [--quick] [--only WORD]
       cargo xtask daemon [--quick]
       cargo xtask cm [--quick] [--veth] [--rxe] [--daemon] [--only WORD]...

test    fmt check, clippy (-D warnings), the workspace's tests, rustdoc
        (-D warnings), pcap-check over the shared RXE captures when present,
        1000 seeds of the simulation through the real data plane on a
        fault grid (each point time-boxed to 150 s; and 400 of the
        transport model), a 90 s share of the
        whole-fault-space sweep, and time-boxed cargo-fuzz runs of
        burst-wire's parser, of the data plane's receive path and of
        burstd's control protocol
        (cargo-fuzz installed on first use)
sweep   the simulation through the real data plane over the whole fault
        space (default 10,000 seeds, each with its own loss, reordering,
        duplication and corruption), on every core; --copy cpu-plain|dsa-model
        runs it with that copy backend (BURST_COPY)
interop burst against kernel RXE in the lab VM (../shared/rxe-lab, root):
        the unmodified ibv_rc_pingpong on RXE against burst's rc_pingpong,
        both roles, MTU 1024 and 4096, with and without loss; --quick runs
        one scenario each way; then the unmodified Debian tools (pingpongs,
        perftest) on burst's drop-in libibverbs against RXE, both roles,
        MTU 1024 and 4096, and burst to burst over a veth pair; --daemon:
        every burst process a client of a burstd (one per burst side)
bench   burst-bench over a veth pair (root): burst, the raw UDP ceiling and
        kernel TCP alternated for N rounds (default 3), a size sweep; writes
        docs/bench-runs/run-*.json (commit it with the report) and
        docs/bench-report.md with plots
dropin  build the drop-in libibverbs (target/dropin), check its exports
        against rdma-core 44's, and run the Debian tools on it: on loopback
        (default), over a veth pair (--veth), against RXE (--rxe);
        --numbers: perftest on burst next to iperf3/sockperf (TCP) over the
        veth pair, 3 alternating rounds; --port af-xdp: every burst process
        on the AF_XDP port (the library built with feature af-xdp)
dataplanes  burst to burst over each kernel-bypass port (root): AF_XDP
        over a veth pair, DPDK over net_memif and net_af_packet; burst-bench's
        eight tests with data verified, ibv_rc_pingpong and ib_write_bw on
        the drop-in (--quick: write_bw and send_lat)
daemon  burstd over a veth pair (root), one daemon per side: perftest and
        ibv_rc_pingpong at once through them, SIGKILL of an application
        mid-transfer (cleanup timed, the other pair's data checked, the
        daemon's descriptors back at baseline), SIGKILL of burstd during
        ib_write_bw (the application ends); without --quick the numbers:
        write_bw and send_lat through burstd against embedded mode, and
        1, 2, 4, 8 pairs sharing one burstd per side
cm      the rdma_cm applications (rping, udaddy, ucmatose, rdma_server/
        rdma_client, perftest -R, cmtime) on burst's drop-in librdmacm:
        burst to burst over a veth pair (--veth) and against the kernel's
        RDMA CM on RXE in the lab VM, both roles (--rxe); default both;
        --quick: rping, udaddy, ib_write_bw -R, cmtime (also part of
        cargo xtask interop); --daemon: over the veth pair through one
        burstd per side (its QP1 routed to the applications' CMs)
congestion  flows through a shared bottleneck on simulated time under each
        congestion control (default 8 and 64 flows): plots of each flow's
        rate and the queue, docs/congestion-report.md";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Runs one step; prints its outcome and returns whether it passed.
fn step(name: &str, cmd: &mut Command) -> bool {
    println!("xtask: ==> {name}: {cmd:?}");
    let t = Instant::now();
    let ok = match cmd.status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {name}: {e}");
            false
        }
    };
    println!(
        "xtask: <== {name}: {} in {:.1}s",
        if ok { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    ok
}

/// [`step`], keeping the lines that say what failed (the failing tests,
/// their panics and cargo's rerun hints) in `notes`, at most 60.
fn step_noting_failures(name: &str, cmd: &mut Command, notes: &mut Vec<String>) -> bool {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    use std::sync::Mutex;
    println!("xtask: ==> {name}: {cmd:?}");
    let t = Instant::now();
    let kept = Mutex::new(Vec::new());
    let ok = match cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(mut child) => {
            let (out, err) = (child.stdout.take(), child.stderr.take());
            // Echoes one stream line by line, keeping what names a failure
            // and the line after a panic (its message).
            let tee = |r: Box<dyn std::io::Read + Send>, to_err: bool| {
                let mut after_panic = false;
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    if to_err {
                        let _ = writeln!(std::io::stderr(), "{line}");
                    } else {
                        let _ = writeln!(std::io::stdout(), "{line}");
                    }
                    let keep = after_panic
                        || line.contains("panicked at")
                        || (line.starts_with("test ") && line.ends_with("FAILED"))
                        || line.starts_with("error: test failed")
                        || line.starts_with("error: ") && line.contains("target");
                    after_panic = line.contains("panicked at");
                    let mut k = kept.lock().unwrap();
                    if keep && k.len() < 60 {
                        k.push(line);
                    }
                }
            };
            std::thread::scope(|s| {
                if let Some(o) = out {
                    s.spawn(|| tee(Box::new(o), false));
                }
                if let Some(e) = err {
                    s.spawn(|| tee(Box::new(e), true));
                }
            });
            child.wait().map(|s| s.success()).unwrap_or(false)
        }
        Err(e) => {
            eprintln!("xtask: cannot run {name}: {e}");
            false
        }
    };
    notes.extend(kept.into_inner().unwrap());
    println!(
        "xtask: <== {name}: {} in {:.1}s",
        if ok { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    ok
}

fn cargo(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root).args(args);
    c
}

fn have_cargo_fuzz() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// cargo-fuzz is a crates.io tool, not a dependency: installed on first use
/// so the README's test command runs the fuzz step it promises.
fn ensure_cargo_fuzz() -> bool {
    have_cargo_fuzz()
        || step(
            "install cargo-fuzz (first run only)",
            Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
        ) && have_cargo_fuzz()
}

/// What the kernel-bypass features build against (clang and libbpf for the
/// XDP program, DPDK for the DPDK port).
/// Removes cargo's unpacked copies of our crates from earlier `cargo
/// package` runs: cargo verifies each package against the others through a
/// local registry, and unpacks a crate of a version it unpacked before only
/// once (`$CARGO_HOME/registry/src/-<hash>/<crate>-<version>`), so a second
/// run on the same machine would build against the first run's sources.
fn forget_packaged_sources() {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return;
    };
    // Local registries are unpacked under a name that starts with '-'
    // (crates.io's has its host name): only those are touched.
    for reg in registries.flatten() {
        if !reg.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(reg.path()) else {
            continue;
        };
        for c in crates.flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            if LIBRARY_CRATES
                .iter()
                .any(|l| name.strip_prefix(l).is_some_and(|v| v.starts_with('-')))
            {
                let _ = std::fs::remove_dir_all(c.path());
            }
        }
    }
}

/// The crates published for others to use, lowest layer first.
const LIBRARY_CRATES: [&str; 9] = [
    "burst-wire",
    "burst-cc",
    "burst-transport",
    "burst-cm",
    "burst-dsa",
    "burst-mem",
    "burst-io",
    "burst-verbs",
    "burst-xfer",
];

const BYPASS_DEBS: &[&str] = &[
    "clang",
    "llvm",
    "libbpf-dev",
    "libelf-dev",
    "zlib1g-dev",
    "libclang-dev",
    "dpdk",
    "libdpdk-dev",
    "pkg-config",
];

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Debian packages the lab steps build or run against: installed when
/// missing and we are root, else a clear message naming them.
fn ensure_debs(pkgs: &[&str]) -> bool {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg")
                .args(["-s", p])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    if !is_root() {
        eprintln!(
            "xtask: missing Debian packages: {} (apt-get install them, or run as root)",
            missing.join(" ")
        );
        return false;
    }
    println!(
        "xtask: installing missing Debian packages: {}",
        missing.join(" ")
    );
    step(
        "apt-get update",
        Command::new("apt-get").args(["update", "-qq"]),
    ) && step(
        "apt-get install",
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(&missing),
    )
}

/// Which simulation: the real data plane (burst-verbs' `Device` over the
/// in-memory port), or burst-transport's model of the network alone.
#[derive(Clone, Copy)]
enum Sim {
    Core,
    Model,
}

/// The transport simulation: `first..first+seeds`, either at one fault
/// point (`faults` = loss, reorder, dup, corrupt) or, with `faults` `None`,
/// drawn per seed over the whole fault space (`--sweep`); `secs` time-boxes it.
fn sim(
    root: &Path,
    which: Sim,
    first: u64,
    seeds: u64,
    faults: Option<[&str; 4]>,
    secs: Option<u64>,
) -> bool {
    let (krate, example) = match which {
        Sim::Core => ("burst-verbs", "core_sim"),
        Sim::Model => ("burst-transport", "sim"),
    };
    let (first, seeds) = (first.to_string(), seeds.to_string());
    let jobs = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string();
    let mut args = vec![
        "run",
        "--release",
        "-q",
        "-p",
        krate,
        "--example",
        example,
        "--",
        "--first-seed",
        &first,
        "--seeds",
        &seeds,
        "--jobs",
        &jobs,
    ];
    let secs = secs.map(|s| s.to_string());
    if let Some(s) = &secs {
        args.extend(["--secs", s]);
    }
    match &faults {
        Some([loss, reorder, dup, corrupt]) => args.extend([
            "--loss",
            loss,
            "--reorder",
            reorder,
            "--dup",
            dup,
            "--corrupt",
            corrupt,
        ]),
        None => args.push("--sweep"),
    }
    step("sim", &mut cargo(root, &args))
}

/// `cargo xtask sweep`: the large simulation sweep over the whole fault space.
fn sweep(args: &[String]) -> ExitCode {
    let mut seeds = 10_000u64;
    let mut first = 1u64;
    let mut secs = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--copy" {
            // The engines' copy backend (BURST_COPY); with an offload
            // backend every copy is offloaded and every 7th model
            // descriptor faults, so the sweep drives the whole path.
            let Some(b) = it.next() else {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            };
            std::env::set_var("BURST_COPY", b);
            if b.starts_with("dsa") || b == "dmadev" {
                std::env::set_var("BURST_COPY_MIN", "0");
                std::env::set_var("BURST_DSA_MODEL_FAULT_EVERY", "7");
            }
            continue;
        }
        let v = it.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--seeds", Some(v)) => seeds = v,
            ("--first-seed", Some(v)) => first = v,
            ("--secs", Some(v)) => secs = Some(v),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if sim(&root(), Sim::Core, first, seeds, None, secs) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn test(args: &[String]) -> ExitCode {
    let root = root();
    let mut fuzz = true;
    let mut fuzz_secs: u32 = 60;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--no-fuzz" => fuzz = false,
            "--fuzz-secs" => match it.next().and_then(|v| v.parse().ok()) {
                Some(v) => fuzz_secs = v,
                None => {
                    eprintln!("{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let mut results: Vec<(&str, bool)> = Vec::new();
    // What failed, by name, for the end of the output.
    let mut failure_notes: Vec<String> = Vec::new();
    let mut skipped: Vec<&str> = Vec::new();
    results.push((
        "fmt",
        step("fmt", &mut cargo(&root, &["fmt", "--all", "--check"])),
    ));
    results.push((
        "clippy",
        step(
            "clippy",
            &mut cargo(
                &root,
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
            ),
        ),
    ));
    results.push((
        "test",
        step_noting_failures(
            "test",
            &mut cargo(&root, &["test", "--workspace", "--no-fail-fast"]),
            &mut failure_notes,
        ),
    ));
    // Every library crate packages and builds from its package alone
    // (one command, so each finds the others it depends on).
    // Built in a target directory of its own, emptied first: cargo takes a
    // registry crate of a version it built before as unchanged, so builds
    // of earlier runs' packages would stand in for this run's.
    let verify_dir = root.join("target/package-verify");
    let _ = std::fs::remove_dir_all(&verify_dir);
    let verify_dir = verify_dir.to_string_lossy().into_owned();
    let mut package = vec!["package", "--allow-dirty", "--target-dir", &verify_dir];
    for c in LIBRARY_CRATES {
        package.extend(["-p", c]);
    }
    forget_packaged_sources();
    results.push(("package", step("package", &mut cargo(&root, &package))));
    // The kernel-bypass ports (features af-xdp and dpdk): lint and unit
    // tests (the XDP program under BPF_PROG_TEST_RUN), then burst to burst
    // over each port (root: namespaces, XDP, DPDK vdevs).
    let debs = ensure_debs(BYPASS_DEBS);
    results.push((
        "clippy --all-features",
        debs && step(
            "clippy --all-features",
            &mut cargo(
                &root,
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--all-features",
                    "--",
                    "-D",
                    "warnings",
                ],
            ),
        ),
    ));
    results.push((
        "test burst-io --features af-xdp,dpdk",
        debs && step(
            "test burst-io --features af-xdp,dpdk",
            &mut cargo(
                &root,
                &["test", "-p", "burst-io", "--features", "af-xdp,dpdk"],
            ),
        ),
    ));
    // The data plane's copies on a DPDK DMA device (dma_skeleton), no
    // allocation per packet over DPDK memif (lent mbufs) and AF_XDP, and
    // AF_XDP lanes (a socket per queue of a two-queue veth).
    results.push((
        "kernel-bypass ports in the data plane: dmadev copies, no allocation per packet \
         over memif and AF_XDP, AF_XDP lanes, AF_XDP drops counted (burst-verbs --features \
         dpdk,af-xdp --test copy --test alloc --test lanes --test xsk_drops)",
        debs && step(
            "test burst-verbs with dpdk and af-xdp: dmadev copies, allocations per port, lanes, drops",
            &mut cargo(
                &root,
                &[
                    "test",
                    "-p",
                    "burst-verbs",
                    "--features",
                    "dpdk,af-xdp",
                    "--test",
                    "copy",
                    "--test",
                    "alloc",
                    "--test",
                    "lanes",
                    "--test",
                    "xsk_drops",
                ],
            ),
        ),
    ));
    if is_root() && debs {
        let runs = dataplanes::run(&root, false, None);
        results.push((
            "kernel-bypass ports burst to burst (AF_XDP, DPDK memif, DPDK af_packet)",
            dropin::summary("dataplanes", &runs),
        ));
    } else {
        skipped.push("kernel-bypass ports burst to burst (needs root)");
    }
    if is_root() {
        let runs = daemon::run(&root, true);
        results.push((
            "burstd over a veth pair (perftest at once, SIGKILL of a client and of burstd)",
            dropin::summary("daemon", &runs),
        ));
    } else {
        skipped.push("burstd over a veth pair (needs root)");
    }
    // The drop-in libibverbs under the unmodified Debian tools, burst to
    // burst on loopback (the RXE and veth matrix: cargo xtask interop).
    let dropin_ok = match dropin::build(&root) {
        Some(dir) => {
            let exports = dropin::check_exports(&root, &dir);
            let mut runs = dropin::device_listing(&dir);
            runs.extend(dropin_loopback(&dir, dropin::QUICK));
            // (Its build failing says what to install when this cannot.)
            let _ = ensure_debs(&["gcc", "libibverbs-dev"]);
            runs.extend(dropin::conformance(&root, &dir));
            let _ = ensure_debs(&["python3-pyverbs"]);
            runs.extend(dropin::rdma_core_tests(&root, &dir));
            let ok = dropin::summary("dropin (loopback)", &runs) && exports;
            results.push(("burst-xfer over libibverbs", xfer_over_dropin(&root, &dir)));
            ok
        }
        None => false,
    };
    results.push((
        "drop-in libibverbs (exports, Debian tools and verbs conformance on loopback)",
        dropin_ok,
    ));
    // The drop-in librdmacm: the rdma_cm tools burst to burst over a veth
    // pair, embedded and through one burstd per side (the RXE set: cargo
    // xtask interop).
    if is_root() {
        let burstd = root.join("target/release/burstd");
        let ok = match dropin::build(&root) {
            Some(dir) if burstd.exists() => {
                let mut runs = cm::veth(&dir, &cm::quick(), 23300, false);
                // Edition 2021: a safe call; no other thread reads it now.
                std::env::set_var("BURST_XTASK_BURSTD", &burstd);
                runs.extend(cm::veth(&dir, &cm::quick(), 23400, true));
                std::env::remove_var("BURST_XTASK_BURSTD");
                dropin::summary("cm (veth)", &runs)
            }
            _ => false,
        };
        results.push((
            "rdma_cm tools over a veth pair, embedded and through burstd",
            ok,
        ));
    } else {
        skipped.push("rdma_cm tools over a veth pair (needs root)");
    }
    let mut doc = cargo(&root, &["doc", "--workspace", "--no-deps"]);
    doc.env("RUSTDOCFLAGS", "-D warnings");
    results.push(("doc", step("doc", &mut doc)));

    // The second golden set, recorded by the lab and shared beside the repo.
    let shared = root.join("../shared/captures/rxe");
    let mut captures: Vec<PathBuf> = std::fs::read_dir(&shared)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    captures.retain(|p| p.extension().is_some_and(|e| e == "pcapng" || e == "pcap"));
    captures.sort();
    if captures.is_empty() {
        println!(
            "xtask: no shared captures at {}: pcap-check skipped",
            shared.display()
        );
    } else {
        let mut c = cargo(
            &root,
            &[
                "run",
                "--release",
                "-q",
                "-p",
                "burst-wire",
                "--example",
                "pcap-check",
                "--",
            ],
        );
        c.args(&captures);
        c.stdout(std::process::Stdio::null());
        results.push((
            "pcap-check (shared RXE captures)",
            step("pcap-check", &mut c),
        ));
    }

    // Congestion control through a shared bottleneck on simulated time:
    // 2 to 64 flows share it fairly with a bounded queue, and overflow it
    // without control (burst-verbs examples/bottleneck.rs --check).
    let mut bn = cargo(
        &root,
        &[
            "run",
            "--release",
            "-q",
            "-p",
            "burst-verbs",
            "--example",
            "bottleneck",
            "--",
            "--check",
            "2",
            "16",
            "64",
        ],
    );
    results.push((
        "bottleneck (congestion control, 2-64 flows)",
        step("bottleneck", &mut bn),
    ));

    // The KV-cache transfer workload, small: burst and TCP, every block
    // of every request checked at the receiver.
    let mut kv = cargo(
        &root,
        &["run", "--release", "-q", "-p", "burst-bench", "--", "kv"],
    );
    kv.args(KV_SMALL.split_whitespace());
    results.push((
        "kv (burst-xfer, burst and TCP, verified)",
        step("kv", &mut kv),
    ));

    // The deterministic simulation through the real data plane (Device over
    // the in-memory port): a thousand seeds across loss 0-10%, reordering
    // 0-10%, duplication 0-2%, corruption 0-1%; then the transport model
    // alone on a smaller share (the fastest check of a transport change).
    let grid: [(&str, &str, &str, &str); 4] = [
        ("0", "0", "0", "0"),
        ("0.02", "0.02", "0.005", "0.005"),
        ("0.05", "0.05", "0.01", "0.01"),
        ("0.1", "0.1", "0.02", "0.01"),
    ];
    for (i, &(loss, reorder, dup, corrupt)) in grid.iter().enumerate() {
        let point = Some([loss, reorder, dup, corrupt]);
        // Time-boxed (the 10% point alone took 460 s on a loaded machine):
        // CI's budget holds, and a slow machine runs fewer seeds, not fewer
        // points.
        let ok = sim(&root, Sim::Core, i as u64 * 250 + 1, 250, point, Some(150));
        results.push(("core sim (250 seeds, 150 s box)", ok));
        let ok = sim(&root, Sim::Model, i as u64 * 250 + 1, 100, point, None);
        results.push(("transport model sim (100 seeds)", ok));
    }
    // A time-boxed share of the large sweep (`cargo xtask sweep`): seeds past
    // the grid's, each with its own point of the whole fault space.
    let ok = sim(&root, Sim::Core, 100_001, 2_000, None, Some(90));
    results.push(("core sim sweep (whole fault space, 90 s box)", ok));
    // The offload copy path end to end: every copy on the DSA model (its
    // own thread), every 7th descriptor faulting; then the plain CPU path.
    for (backend, name) in [
        ("dsa-model", "core sim, copies on the DSA model (60 s box)"),
        ("cpu-plain", "core sim, plain CPU copies (60 s box)"),
    ] {
        std::env::set_var("BURST_COPY", backend);
        std::env::set_var("BURST_COPY_MIN", "0");
        std::env::set_var("BURST_DSA_MODEL_FAULT_EVERY", "7");
        let ok = sim(&root, Sim::Core, 200_001, 400, None, Some(60));
        results.push((name, ok));
    }
    for k in [
        "BURST_COPY",
        "BURST_COPY_MIN",
        "BURST_DSA_MODEL_FAULT_EVERY",
    ] {
        std::env::remove_var(k);
    }

    if fuzz {
        if ensure_cargo_fuzz() {
            // Stable rustc with RUSTC_BOOTSTRAP: the sanitizer flags cargo-fuzz
            // passes are nightly-only, and only the stable toolchain is
            // guaranteed on a fresh machine.
            // The codec's parser, and the data plane's receive path (frames
            // into a live device: burst-verbs' RxHarness), each time-boxed.
            let max = format!("-max_total_time={fuzz_secs}");
            for (krate, target, name) in [
                ("burst-wire", "parse", "fuzz (burst-wire parse)"),
                ("burst-verbs", "rx", "fuzz (burst-verbs receive path)"),
                ("burstd", "control", "fuzz (burstd control protocol)"),
                (
                    "burstd",
                    "segments",
                    "fuzz (burstd shared segments under a hostile client)",
                ),
            ] {
                let mut c = Command::new("cargo");
                c.current_dir(root.join("crates").join(krate))
                    .env("RUSTC_BOOTSTRAP", "1")
                    .args(["fuzz", "run", target, "--", &max, "-rss_limit_mb=2048"]);
                results.push((name, step("fuzz", &mut c)));
            }
        } else {
            skipped.push("fuzz (cargo-fuzz could not be installed)");
        }
    } else {
        skipped.push("fuzz (--no-fuzz)");
    }

    let failed: Vec<&str> = results.iter().filter(|r| !r.1).map(|r| r.0).collect();
    if !failed.is_empty() {
        // Repeated at the end: CI keeps only the tail of a run's output.
        for l in failure_notes.iter().chain(&dropin::failed_cases()) {
            println!("xtask: failure: {l}");
        }
        println!("xtask: failed steps: {}", failed.join(", "));
    }
    if !skipped.is_empty() {
        println!("xtask: skipped steps: {}", skipped.join(", "));
    }
    println!(
        "steps: {} passed, {} failed, {} skipped",
        results.len() - failed.len(),
        failed.len(),
        skipped.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One interop scenario: RXE in VM a runs `vm` (its stock tools on the
/// real libibverbs); burst runs `host` in the lab namespace on 198.18.0.1.
struct Scenario {
    name: &'static str,
    /// burst's example that plays the peer (rc_pingpong or ud_pingpong).
    tool: &'static str,
    eth_mtu: &'static str,
    /// The VM runs the server (else burst does).
    vm_serves: bool,
    vm: &'static str,
    host: &'static str,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong burst client -> RXE server, 3001 B, MTU 1024",
        eth_mtu: "1500",
        vm_serves: true,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 3001 -c",
        host: "-n 20 -s 3001 -c 198.18.0.2",
    },
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong RXE client -> burst server, 64 KiB, MTU 1024",
        eth_mtu: "1500",
        vm_serves: false,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 65536 -c $RXE_HOST_IP",
        host: "-n 20 -s 65536 -c",
    },
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong burst client -> RXE server, 1 MiB, MTU 4096",
        eth_mtu: "9000",
        vm_serves: true,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 5 -s 1048576 -m 4096 -c",
        host: "-n 5 -s 1048576 -m 4096 -c 198.18.0.2",
    },
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong RXE client -> burst server, 1 B, MTU 4096",
        eth_mtu: "9000",
        vm_serves: false,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 50 -s 1 -m 4096 $RXE_HOST_IP",
        host: "-n 50 -s 1 -m 4096",
    },
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong burst client -> RXE server, 64 KiB, burst drops 1 packet in 50",
        eth_mtu: "1500",
        vm_serves: true,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 65536 -c",
        host: "-n 20 -s 65536 -c -l 50 198.18.0.2",
    },
    Scenario {
        tool: "rc_pingpong",
        name: "rc_pingpong RXE client -> burst server, 64 KiB, burst drops 1 packet in 50",
        eth_mtu: "1500",
        vm_serves: false,
        vm: "ibv_rc_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 65536 -c $RXE_HOST_IP",
        host: "-n 20 -s 65536 -c -l 50",
    },
    Scenario {
        tool: "ud_pingpong",
        name: "ud_pingpong burst client -> RXE server, 999 B",
        eth_mtu: "1500",
        vm_serves: true,
        vm: "ibv_ud_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 999",
        host: "-n 20 -s 999 198.18.0.2",
    },
    Scenario {
        tool: "ud_pingpong",
        name: "ud_pingpong RXE client -> burst server, 1024 B",
        eth_mtu: "1500",
        vm_serves: false,
        vm: "ibv_ud_pingpong -d rxe0 -g $RXE_GID_INDEX -n 20 -s 1024 $RXE_HOST_IP",
        host: "-n 20 -s 1024",
    },
    Scenario {
        tool: "rdma_rw",
        name: "RDMA READ + WRITE 512 KiB each from burst into memory registered on RXE",
        eth_mtu: "1500",
        vm_serves: true,
        vm: "{target} -g $RXE_GID_INDEX -s 1048576",
        host: "198.18.0.2",
    },
    Scenario {
        tool: "rdma_rw",
        name: "RDMA READ + WRITE into RXE memory at MTU 4096, burst drops 1 packet in 50",
        eth_mtu: "9000",
        vm_serves: true,
        vm: "{target} -g $RXE_GID_INDEX -s 4194304 -m 4096",
        host: "-m 4096 -l 50 198.18.0.2",
    },
];

fn interop(args: &[String]) -> ExitCode {
    if let Err(c) = take_port_flag(args) {
        return c;
    }
    if let Err(c) = take_daemon_flag(&root(), args) {
        return c;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let root = root();
    let lab = root.join("../shared/rxe-lab/rxe-vm");
    if !lab.exists() {
        eprintln!("xtask interop: no RXE lab at {}", lab.display());
        return ExitCode::FAILURE;
    }
    // rdma-target builds against the system libibverbs; the Debian tools
    // run on burst's drop-in.
    if !ensure_debs(&[
        "libibverbs-dev",
        "ibverbs-utils",
        "perftest",
        "ucx-utils",
        "openmpi-bin",
        "libopenmpi-dev",
        "iproute2",
        "gcc",
    ]) {
        return ExitCode::FAILURE;
    }
    // Set the lab up first: `wait-port` needs the namespace before the VM's
    // own set-up would create it.
    if !step("lab setup", Command::new("bash").arg(&lab).arg("setup")) {
        return ExitCode::FAILURE;
    }
    if !step(
        "build the interop examples",
        cargo(
            &root,
            &["build", "--release", "-p", "burst-verbs", "--examples"],
        )
        .args(dropin::port_features()),
    ) {
        return ExitCode::FAILURE;
    }
    let examples = root.join("target/release/examples");
    // The passive side of the RDMA WRITE/READ test, built against the
    // system libibverbs; the VM shares this file system.
    let target_bin = root.join("target/interop/rdma-target");
    let _ = std::fs::create_dir_all(root.join("target/interop"));
    if !step(
        "build rdma-target",
        Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&target_bin)
            .arg(root.join("interop/rdma-target.c"))
            .arg("-libverbs"),
    ) {
        return ExitCode::FAILURE;
    }
    // --examples-only WORD: just the example scenarios whose name has WORD
    // (the drop-in matrix is skipped).
    let only: Option<&str> = args
        .windows(2)
        .find(|w| w[0] == "--examples-only")
        .map(|w| w[1].as_str());
    // --ucx-only: just the UCX cases (burst to burst and against RXE).
    let ucx_only = args.iter().any(|a| a == "--ucx-only");
    let chosen: Vec<&Scenario> = if ucx_only {
        Vec::new()
    } else if let Some(w) = only {
        SCENARIOS.iter().filter(|s| s.name.contains(w)).collect()
    } else if quick {
        SCENARIOS.iter().take(2).collect()
    } else {
        SCENARIOS.iter().collect()
    };
    let (mut passed, mut failed) = (0, 0);
    for sc in chosen {
        println!("xtask: ==> interop: {}", sc.name);
        // Each scenario starts from a lab that is up (a failed one tears it down).
        let _ = Command::new("bash").arg(&lab).arg("setup").status();
        // Daemon mode: a burstd on the host's address, with the
        // scenario's loss (`-l N`) applied by the daemon's port.
        let loss = sc
            .host
            .split_whitespace()
            .skip_while(|w| *w != "-l")
            .nth(1)
            .and_then(|n| n.parse().ok());
        let daemon = dropin::start_daemon(Some("burstlab"), "198.18.0.1", loss);
        let host = |extra: &str| {
            let mut c = Command::new("timeout");
            c.arg("180")
                .arg("ip")
                .args(["netns", "exec", "burstlab"])
                .arg(examples.join(sc.tool))
                .args(["--local", "198.18.0.1"]);
            c.args(extra.split_whitespace());
            if let Some(d) = &daemon {
                c.env("BURST_DAEMON", &d.socket);
            }
            c
        };
        dropin::wait_lab_slot("run-a");
        let mut vm = Command::new("bash");
        let vm_cmd = sc.vm.replace("{target}", &target_bin.to_string_lossy());
        vm.arg(&lab).args([
            "run",
            "--mtu",
            sc.eth_mtu,
            "--timeout",
            "240",
            "--",
            &vm_cmd,
        ]);
        let ok = if sc.vm_serves {
            let mut v = match vm.spawn() {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("xtask: cannot start the VM: {e}");
                    failed += 1;
                    continue;
                }
            };
            let up = Command::new("bash")
                .arg(&lab)
                .args(["wait-port", "18515", "300"])
                .status()
                .is_ok_and(|s| s.success());
            let h = up && host(sc.host).status().is_ok_and(|s| s.success());
            if !h {
                // Stop the VM (its server waits for a client that failed).
                let _ = Command::new("bash").arg(&lab).arg("teardown").status();
            }
            let vs = v.wait().is_ok_and(|s| s.success());
            h && vs
        } else {
            let mut h = match host(sc.host).spawn() {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("xtask: cannot start rc_pingpong: {e}");
                    failed += 1;
                    continue;
                }
            };
            std::thread::sleep(std::time::Duration::from_millis(500));
            let vs = vm.status().is_ok_and(|s| s.success());
            if !vs {
                let _ = h.kill();
            }
            let hs = h.wait().is_ok_and(|s| s.success());
            vs && hs
        };
        println!(
            "xtask: <== interop: {}: {}",
            sc.name,
            if ok { "ok" } else { "FAILED" }
        );
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    // The unmodified Debian tools on burst's drop-in libibverbs: against
    // RXE in both roles, and burst to burst over a veth pair.
    match (only.is_none()).then(|| dropin::build(&root)).flatten() {
        Some(dir) => {
            let c4 = if quick { &[][..] } else { dropin::CASES_4096 };
            let cases = dropin::for_port(if quick { dropin::QUICK } else { dropin::CASES });
            let mut runs = Vec::new();
            let default_port = std::env::var("BURST_PORT").is_err();
            let embedded = std::env::var_os("BURST_XTASK_BURSTD").is_none();
            if !ucx_only {
                runs.extend(dropin_rxe(&root, &dir, cases, c4));
                if default_port {
                    // RoCE v2 over IPv6 against RXE (the UDP port).
                    let v6 = if quick {
                        dropin::V6_QUICK
                    } else {
                        dropin::V6_CASES
                    };
                    runs.extend(dropin::rxe_v6(&root, &dir, v6, true, 23900));
                    runs.extend(dropin::rxe_v6(&root, &dir, v6, false, 24000));
                }
                runs.extend(dropin::veth(&dir, cases, c4));
                // rdma_cm: the drop-in librdmacm against the kernel's RDMA
                // CM and burst to burst, on the default port and embedded
                // (through burstd: cargo xtask test, cargo xtask cm --daemon).
                if default_port && embedded {
                    runs.extend(cm_runs(&root, &dir, quick, true, true, &[]));
                }
            }
            if default_port {
                // UCX: burst to burst (embedded or through burstd), and
                // against RXE (embedded).
                let (v, r) = if quick {
                    (dropin::UCX_QUICK, dropin::UCX_RXE_QUICK)
                } else {
                    (dropin::UCX_CASES, dropin::UCX_RXE_CASES)
                };
                runs.extend(dropin::veth(&dir, v, &[]));
                if embedded {
                    runs.extend(dropin::mpi_veth(&root, &dir));
                    runs.extend(dropin::rxe(&root, &dir, r, "1500", true, 23700));
                    runs.extend(dropin::rxe(&root, &dir, r, "1500", false, 23800));
                }
            }
            // The same program on RXE: what burst is held to (once; it
            // does not depend on burst's port or mode).
            if !ucx_only && default_port && embedded {
                runs.extend(dropin::conformance_rxe(&root));
            }
            for r in &runs {
                if r.ok {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
        }
        None if only.is_none() => failed += 1,
        None => {}
    }
    println!("interop: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The rdma_cm set: over the veth pair and against RXE (both roles).
fn cm_runs(
    root: &Path,
    dir: &Path,
    quick: bool,
    veth: bool,
    rxe: bool,
    only: &[String],
) -> Vec<dropin::Outcome> {
    let daemons = std::env::var_os("BURST_XTASK_BURSTD").is_some();
    let cases: Vec<&cm::CmCase> = if quick {
        cm::quick()
    } else {
        cm::CASES.iter().chain(cm::VETH_ONLY).collect()
    };
    let cases = cm::narrowed(cases, only);
    let rxe_cases = |vm_serves: bool| -> Vec<&cm::CmCase> {
        let c = if quick {
            cm::quick_rxe(vm_serves)
        } else {
            cm::CASES.iter().collect()
        };
        cm::narrowed(c, only)
    };
    let mut runs = Vec::new();
    if veth {
        runs.extend(cm::veth(dir, &cases, 23000, daemons));
        if only.is_empty() {
            runs.extend(cm::veth_v6(dir, 23060, daemons));
        }
    }
    if rxe {
        let v6 = if only.is_empty() {
            cm::rxe_v6_cases(quick)
        } else {
            &[]
        };
        runs.extend(cm::rxe(root, dir, &rxe_cases(true), v6, true, 23100));
        runs.extend(cm::rxe(root, dir, &rxe_cases(false), v6, false, 23200));
    }
    runs
}

fn cm_cmd(args: &[String]) -> ExitCode {
    let root = root();
    let has = |f: &str| args.iter().any(|a| a == f);
    if let Err(c) = take_daemon_flag(&root, args) {
        return c;
    }
    let (mut veth, mut rxe) = (has("--veth"), has("--rxe"));
    if !veth && !rxe {
        (veth, rxe) = (true, true);
    }
    let Some(dir) = dropin::build(&root) else {
        return ExitCode::FAILURE;
    };
    // --only WORD (repeatable): just the cases whose name contains a WORD.
    let only: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].clone())
        .collect();
    let runs = cm_runs(&root, &dir, has("--quick"), veth, rxe, &only);
    if dropin::summary("cm", &runs) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// burst to burst on loopback: two processes, two 127/8 addresses.
fn dropin_loopback(dir: &Path, cases: &[dropin::Case]) -> Vec<dropin::Outcome> {
    let side = |addr: &str| dropin::BurstSide {
        ns: None,
        addr: addr.into(),
        libdir: dir.into(),
        rdma_addr: None,
        daemon: None,
    };
    dropin::burst_pair(
        cases,
        &side("127.0.95.1"),
        &side("127.0.95.2"),
        "burst<->burst loopback",
        22000,
    )
}

/// The small KV request `cargo xtask test` runs on each stack: every block
/// of every request checked at the receiver.
const KV_SMALL: &str =
    "--tokens 128 --concurrency 1,2 --qps 1,3 --requests 4 --pool-gib 0.25 --verify";

/// burst-xfer's libibverbs sessions on the drop-in (`dir`): its tests
/// (two sessions on one device, a peer that goes away, against a
/// burst-verbs session) and the KV workload through them, every block
/// checked.
fn xfer_over_dropin(root: &Path, dir: &Path) -> bool {
    let on_dropin = |c: &mut Command| {
        c.env("LD_LIBRARY_PATH", dir)
            .env("BURST_ADDR", "127.0.145.1")
            .env("BURST_XFER_IBV_DEV", "burst0")
            .env("BURST_XFER_IBV_GID", "0");
    };
    let mut test = cargo(
        root,
        &[
            "test",
            "--release",
            "-p",
            "burst-xfer",
            "--features",
            "libibverbs",
            "--test",
            "ibv",
        ],
    );
    on_dropin(&mut test);
    let mut kv = cargo(
        root,
        &[
            "run",
            "--release",
            "-q",
            "-p",
            "burst-bench",
            "--features",
            "libibverbs",
            "--",
            "kv",
            "--transport",
            "verbs",
            "--ibv-dev",
            "burst0",
            "--gid-index",
            "0",
        ],
    );
    kv.args(KV_SMALL.split_whitespace());
    on_dropin(&mut kv);
    step("burst-xfer over libibverbs (drop-in)", &mut test)
        & step("kv through libibverbs (drop-in, verified)", &mut kv)
}

/// The drop-in scenarios against RXE: both roles, MTU 1024 and 4096.
fn dropin_rxe(
    root: &Path,
    dir: &Path,
    cases: &[dropin::Case],
    cases_4096: &[dropin::Case],
) -> Vec<dropin::Outcome> {
    let mut all = Vec::new();
    if !cases.is_empty() {
        all.extend(dropin::rxe(root, dir, cases, "1500", true, 23000));
        all.extend(dropin::rxe(root, dir, cases, "1500", false, 23200));
    }
    if !cases_4096.is_empty() {
        all.extend(dropin::rxe(root, dir, cases_4096, "9000", true, 23400));
        all.extend(dropin::rxe(root, dir, cases_4096, "9000", false, 23500));
    }
    if !cases.is_empty() {
        all.extend(dropin::wire_check(root, dir, 23600));
    }
    all
}

/// `--port NAME`: burst's packet port for the drop-in runs (BURST_PORT,
/// inherited by every burst process started; the build adds the feature).
/// `--daemon`: every burst process of the run is a client of a burstd
/// (one per burst side, started and stopped around each set of cases).
fn take_daemon_flag(root: &Path, args: &[String]) -> Result<(), ExitCode> {
    if !args.iter().any(|a| a == "--daemon") {
        return Ok(());
    }
    let mut c = cargo(root, &["build", "--release", "-p", "burstd"]);
    c.args(dropin::port_features());
    if !step("build burstd", &mut c) {
        return Err(ExitCode::FAILURE);
    }
    // Edition 2021: a safe call; made before any thread starts.
    std::env::set_var("BURST_XTASK_BURSTD", root.join("target/release/burstd"));
    Ok(())
}

fn take_port_flag(args: &[String]) -> Result<(), ExitCode> {
    if let Some(w) = args.windows(2).find(|w| w[0] == "--port") {
        if !matches!(w[1].as_str(), "udp" | "af-xdp" | "af-xdp-generic" | "dpdk") {
            eprintln!("xtask: --port: one of udp, af-xdp, af-xdp-generic, dpdk");
            return Err(ExitCode::FAILURE);
        }
        // Edition 2021: a safe call; made before any thread starts.
        std::env::set_var("BURST_PORT", &w[1]);
        if w[1] == "dpdk" && std::env::var_os("BURST_DPDK").is_none() {
            // The lab's bridge (RXE runs: burst's address 198.18.0.10).
            std::env::set_var(
                "BURST_DPDK",
                "--vdev=net_af_packet0,iface=rxebr0,framesz=8192,blocksz=8192,framecnt=512 \
                 device=net_af_packet0",
            );
        }
    }
    Ok(())
}

fn dropin_cmd(args: &[String]) -> ExitCode {
    let root = root();
    if let Err(c) = take_port_flag(args) {
        return c;
    }
    if let Err(c) = take_daemon_flag(&root, args) {
        return c;
    }
    let has = |f: &str| args.iter().any(|a| a == f);
    let quick = has("--quick");
    // --only WORD (repeatable): just the cases whose name contains a WORD.
    let only: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].as_str())
        .collect();
    let pick = |cases: &'static [dropin::Case]| -> &'static [dropin::Case] {
        if only.is_empty() {
            return cases;
        }
        let v: Vec<dropin::Case> = cases
            .iter()
            .filter(|c| only.iter().any(|o| c.name().contains(o)))
            .copied()
            .collect();
        Box::leak(v.into_boxed_slice())
    };
    let Some(dir) = dropin::build(&root) else {
        return ExitCode::FAILURE;
    };
    let mut all = Vec::new();
    let exports = dropin::check_exports(&root, &dir);
    all.push(dropin::Outcome {
        name: "exports match rdma-core 44".into(),
        ok: exports,
        numbers: None,
        why: "see the list above".into(),
    });
    let (veth, rxe) = (has("--veth"), has("--rxe"));
    let cases = pick(dropin::for_port(if quick {
        dropin::QUICK
    } else {
        dropin::CASES
    }));
    let c4 = pick(if quick { &[] } else { dropin::CASES_4096 });
    if has("--loopback") || !(veth || rxe || has("--numbers") || has("--v6")) {
        all.extend(dropin::device_listing(&dir));
        all.extend(dropin_loopback(&dir, cases));
        all.extend(dropin::rdma_core_tests(&root, &dir));
    }
    if veth {
        all.extend(dropin::veth(&dir, cases, c4));
    }
    if rxe {
        all.extend(dropin_rxe(&root, &dir, cases, c4));
    }
    if has("--v6") {
        let v6 = pick(if quick {
            dropin::V6_QUICK
        } else {
            dropin::V6_CASES
        });
        all.extend(dropin::rxe_v6(&root, &dir, v6, true, 23900));
        all.extend(dropin::rxe_v6(&root, &dir, v6, false, 24000));
    }
    if has("--numbers") {
        let figs = dropin::numbers(&dir, 3);
        all.push(dropin::Outcome {
            name: "numbers over the veth pair".into(),
            ok: figs
                .iter()
                .all(|f| !f.burst.is_empty() && !f.tcp.is_empty()),
            numbers: None,
            why: "a measurement did not run (iperf3 and sockperf installed?)".into(),
        });
    }
    if dropin::summary("dropin", &all) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("interop") => interop(&args[1..]),
        Some("dataplanes") => {
            let root = root();
            if !ensure_debs(BYPASS_DEBS) {
                return ExitCode::FAILURE;
            }
            let quick = args.iter().any(|a| a == "--quick");
            let only = args
                .windows(2)
                .find(|w| w[0] == "--only")
                .map(|w| w[1].as_str());
            let runs = dataplanes::run(&root, quick, only);
            if dropin::summary("dataplanes", &runs) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Some("daemon") => {
            let quick = args.iter().any(|a| a == "--quick");
            let runs = daemon::run(&root(), quick);
            if dropin::summary("daemon", &runs) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Some("dropin") => dropin_cmd(&args[1..]),
        Some("cm") => cm_cmd(&args[1..]),
        Some("bench") => bench::bench(&root(), &args[1..]),
        Some("sweep") => sweep(&args[1..]),
        Some("congestion") => congestion::report(&root(), &args[1..]),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
