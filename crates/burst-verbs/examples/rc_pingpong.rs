//! rc_pingpong: rdma-core's `ibv_rc_pingpong` on burst, speaking its
//! out-of-band exchange (TCP port 18515, "LID:QPN:PSN:GID") so it runs
//! against the unmodified tool on kernel RXE or an RNIC, in either role.
//!
//! ```text
//! rc_pingpong --local IP [-p PORT] [-s SIZE] [-n ITERS] [-m MTU] [-r RX_DEPTH] [-c] [-l N] [SERVER]
//! ```
//!
//! Like the original, one buffer of SIZE bytes (filled with 0x7b) is sent and
//! received; `-c` zeroes the first byte of every 4 KiB page and checks it on
//! receive. `-l N` makes burst drop one outgoing packet in N at random (loss
//! test). Exits non-zero on any error or data mismatch.

use std::net::{IpAddr, Ipv6Addr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::config::DeviceConfig;
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn};

#[path = "pingpong/oob.rs"]
mod oob;
use oob::wire_msg;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const PAGE: usize = 4096;

struct Opts {
    local: IpAddr,
    port: u16,
    size: usize,
    iters: u64,
    mtu: Mtu,
    rx_depth: u64,
    check: bool,
    drop_every: u64,
    server: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        local: IpAddr::from([0, 0, 0, 0]),
        port: 18515,
        size: 4096,
        iters: 1000,
        mtu: Mtu::Mtu1024,
        rx_depth: 500,
        check: false,
        drop_every: 0,
        server: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let val = |i: usize| {
        args.get(i + 1)
            .cloned()
            .ok_or(format!("{} needs a value", args[i]))
    };
    let mut have_local = false;
    while i < args.len() {
        match args[i].as_str() {
            "--local" => {
                o.local = val(i)?.parse().map_err(|e| format!("--local: {e}"))?;
                have_local = true;
                i += 1;
            }
            "-p" => {
                o.port = val(i)?.parse().map_err(|e| format!("-p: {e}"))?;
                i += 1;
            }
            "-s" => {
                o.size = val(i)?.parse().map_err(|e| format!("-s: {e}"))?;
                i += 1;
            }
            "-n" => {
                o.iters = val(i)?.parse().map_err(|e| format!("-n: {e}"))?;
                i += 1;
            }
            "-r" => {
                o.rx_depth = val(i)?.parse().map_err(|e| format!("-r: {e}"))?;
                i += 1;
            }
            "-l" => {
                o.drop_every = val(i)?.parse().map_err(|e| format!("-l: {e}"))?;
                i += 1;
            }
            "-m" => {
                let m: usize = val(i)?.parse().map_err(|e| format!("-m: {e}"))?;
                o.mtu = Mtu::from_bytes(m).ok_or("-m must be 256, 512, 1024, 2048 or 4096")?;
                i += 1;
            }
            "-c" => o.check = true,
            "-g" | "-d" | "-i" => i += 1, // device and GID index: burst has one of each
            s if !s.starts_with('-') => o.server = Some(s.to_string()),
            s => return Err(format!("unknown option {s}")),
        }
        i += 1;
    }
    if !have_local {
        return Err("--local IP is required (the address to bind UDP 4791 on)".into());
    }
    o.rx_depth = o.rx_depth.min(o.iters.max(1));
    Ok(o)
}

fn run(o: Opts) -> Result<(), String> {
    // The packet port, as the drop-in takes it: BURST_PORT (an AF_XDP port
    // needs the interface that holds --local).
    let port = match std::env::var("BURST_PORT") {
        Ok(p) => burst_verbs::config::PortKind::from_name(&p)
            .ok_or_else(|| format!("BURST_PORT={p}: one of udp, af-xdp, af-xdp-generic, dpdk"))?,
        Err(_) => Default::default(),
    };
    let mut cfg = match port {
        burst_verbs::config::PortKind::Udp => DeviceConfig {
            name: "burst0".into(),
            addr: o.local,
            interface: None,
            mtu: Mtu::Mtu4096,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port,
            dpdk: String::new(),
            threads: 1,
            copy: Default::default(),
            engine: Default::default(),
        },
        burst_verbs::config::PortKind::Dpdk => {
            let mut c = DeviceConfig::owned_link("burst0", o.local);
            c.dpdk = std::env::var("BURST_DPDK").unwrap_or_default();
            c
        }
        burst_verbs::config::PortKind::AfXdp { .. } => {
            DeviceConfig::for_addr("burst0", o.local).map_err(|e| e.to_string())?
        }
    };
    cfg.port = port;
    cfg.mtu = Mtu::Mtu4096;
    cfg.drop_every = o.drop_every;
    // BURST_DAEMON: burstd's device (its own loss setting applies).
    let (engine, dev) = burst_verbs::engine::open_device(&cfg).map_err(|e| e.to_string())?;
    let pd = dev.alloc_pd();
    let mut buf = vec![0x7bu8; o.size.max(1)];
    let expected = buf.clone();
    let mut expected = expected;
    if o.check {
        for i in (0..o.size).step_by(PAGE) {
            buf[i] = 0;
            expected[i] = 0;
        }
    }
    // SAFETY: `buf` lives until the end of `run`, after the engine is dropped.
    let mr = unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }
        .map_err(|e| e.to_string())?;
    let cq = dev.create_cq(o.rx_depth as usize + 1);
    let qpn = dev
        .create_qp(QpType::Rc, pd, cq, cq, o.rx_depth.max(1) as usize)
        .map_err(|e| e.to_string())?;
    // INIT first: receives are posted before the exchange, as in pingpong.c.
    let init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(QpAccess::default()),
        ..Default::default()
    };
    dev.modify_qp(qpn, &init)
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let sge: burst_transport::SgList = [Sge {
        addr: mr.addr,
        length: o.size as u32,
        lkey: mr.lkey,
    }]
    .into();
    for _ in 0..o.rx_depth {
        dev.post_recv(
            qpn,
            &RecvWr {
                wr_id: RECV_WRID,
                sg_list: sge,
            },
        )
        .map_err(|e| e.to_string())?;
    }
    let my_psn = Psn::new(
        (Instant::now().elapsed().as_nanos() as u32 ^ std::process::id().wrapping_mul(2654435761))
            & 0xff_ffff,
    );
    let gid = dev.gid();
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        qpn.value(),
        my_psn.value(),
        Ipv6Addr::from(gid)
    );
    let msg = wire_msg(qpn, my_psn, gid);
    let params = RcParams::new(my_psn, o.mtu);
    let (rqpn, rpsn, rgid) =
        oob::exchange(o.server.as_deref(), o.local, o.port, &msg, |(q, p, g)| {
            dev.connect_rc(
                qpn,
                &RcPeer {
                    gid: g,
                    qpn: q,
                    psn: p,
                },
                &params,
            )
            .map_err(|e| e.to_string())
        })?;
    println!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rqpn.value(),
        rpsn.value(),
        Ipv6Addr::from(rgid)
    );

    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    let (mut scnt, mut rcnt, mut routs) = (0u64, 0u64, o.rx_depth);
    let mut pending = RECV_WRID;
    let post_send = || {
        dev.post_send(qpn, &SendWr::new(SEND_WRID, SendOp::Send, sge))
            .map_err(|e| e.to_string())
    };
    if o.server.is_some() {
        post_send()?;
        pending |= SEND_WRID;
    }
    while rcnt < o.iters || scnt < o.iters {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {scnt} sends and {rcnt} receives; counters {:?} qp {:?}",
                dev.counters(),
                dev.describe_qps()
            ));
        }
        let Some(wc) = dev.poll_cq(cq) else { continue };
        if wc.status != WcStatus::Success {
            return Err(format!(
                "failed status {:?} for wr_id {} after {scnt} sends and {rcnt} receives; device {:?}; qp {:?}",
                wc.status,
                wc.wr_id,
                dev.counters(),
                dev.describe_qps()
            ));
        }
        match wc.wr_id {
            SEND_WRID => scnt += 1,
            RECV_WRID => {
                if wc.byte_len as usize != o.size {
                    return Err(format!(
                        "received {} bytes, expected {}",
                        wc.byte_len, o.size
                    ));
                }
                // The buffer is shared between send and receive, as in the
                // original; the peer sends the same pattern back.
                if buf != expected {
                    let bad = buf
                        .iter()
                        .zip(&expected)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    return Err(format!("data mismatch at byte {bad} after receive {rcnt}"));
                }
                rcnt += 1;
                routs -= 1;
                if routs <= 1 {
                    for _ in 0..(o.rx_depth - routs) {
                        dev.post_recv(
                            qpn,
                            &RecvWr {
                                wr_id: RECV_WRID,
                                sg_list: sge,
                            },
                        )
                        .map_err(|e| e.to_string())?;
                        routs += 1;
                    }
                }
            }
            other => return Err(format!("completion for unknown wr_id {other}")),
        }
        pending &= !wc.wr_id;
        if scnt < o.iters && pending == 0 {
            post_send()?;
            pending = RECV_WRID | SEND_WRID;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = o.size as f64 * o.iters as f64 * 2.0;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        secs,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        secs,
        secs * 1e6 / o.iters as f64
    );
    let c = dev.counters().map_err(|e| e.to_string())?;
    println!(
        "burst: {} packets sent, {} received (ICRC: {} verified, {} verified with the peer's IP ID solved for, {} unverifiable, {} bad); data verified",
        c.sent_pkts, c.rcvd_pkts, c.icrc_verified, c.icrc_id_solved, c.icrc_unverified, c.icrc_errors
    );
    drop(dev);
    drop(engine);
    drop(buf);
    Ok(())
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rc_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
