//! rdma_rw: RDMA READ and RDMA WRITE from burst into memory that a peer
//! program registered on another stack (interop/rdma-target.c on kernel RXE).
//!
//! ```text
//! rdma_rw --local IP [-p PORT] [-m MTU] [-l N] TARGET
//! ```
//!
//! READs the first half of the target's buffer and checks its pattern
//! ((i*13+7) & 0xff), WRITEs (i*31+SEED) & 0xff over the second half, then
//! asks the target to check it ("check SEED"); exits 0 only if both sides
//! verified their data.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::config::DeviceConfig;
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut local, mut port, mut mtu, mut loss, mut target) =
        (None, 18515u16, Mtu::Mtu1024, 0u64, None);
    let mut i = 0;
    while i < args.len() {
        let v = || {
            args.get(i + 1)
                .cloned()
                .ok_or(format!("{} needs a value", args[i]))
        };
        match args[i].as_str() {
            "--local" => local = Some(v()?.parse::<IpAddr>().map_err(|e| e.to_string())?),
            "-p" => port = v()?.parse().map_err(|e| format!("-p: {e}"))?,
            "-l" => loss = v()?.parse().map_err(|e| format!("-l: {e}"))?,
            "-m" => {
                mtu = Mtu::from_bytes(v()?.parse().map_err(|e| format!("-m: {e}"))?)
                    .ok_or("bad -m")?
            }
            s if !s.starts_with('-') => {
                target = Some(s.to_string());
                i += 1;
                continue;
            }
            s => return Err(format!("unknown option {s}")),
        }
        i += 2;
    }
    let (local, target) = (
        local.ok_or("--local IP is required")?,
        target.ok_or("TARGET is required")?,
    );
    let mut s = TcpStream::connect((target.as_str(), port))
        .map_err(|e| format!("connect {target}:{port}: {e}"))?;
    let mut rd = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let mut line = String::new();
    rd.read_line(&mut line).map_err(|e| e.to_string())?;
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 6 || f[2].len() != 32 {
        return Err(format!("bad target line {line:?}"));
    }
    let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|e| e.to_string());
    let (tqpn, tpsn, rkey, vaddr, size) = (
        hex(f[0])? as u32,
        hex(f[1])? as u32,
        hex(f[3])? as u32,
        hex(f[4])?,
        hex(f[5])? as usize,
    );
    let mut tgid = [0u8; 16];
    for (k, g) in tgid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&f[2][2 * k..2 * k + 2], 16).map_err(|e| e.to_string())?;
    }
    // BURST_DAEMON: burstd's device (its own loss setting applies).
    let (engine, dev) = burst_verbs::engine::open_device(&DeviceConfig {
        name: "burst0".into(),
        addr: local,
        interface: None,
        mtu: Mtu::Mtu4096,
        drop_every: loss,
        congestion_control: burst_cc::Algorithm::default(),
        port: Default::default(),
        dpdk: String::new(),
        threads: 1,
        copy: Default::default(),
        engine: Default::default(),
    })
    .map_err(|e| e.to_string())?;
    let pd = dev.alloc_pd();
    let half = size / 2;
    let seed = std::process::id() % 251;
    let mut buf: Vec<u8> = (0..size)
        .map(|i| {
            if i < half {
                0
            } else {
                (i as u32).wrapping_mul(31).wrapping_add(seed) as u8
            }
        })
        .collect();
    // SAFETY: `buf` outlives the engine, dropped before it below.
    let mr =
        unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), size, Access(1)) }.map_err(|e| e.to_string())?;
    let cq = dev.create_cq(4);
    let qpn = dev
        .create_qp(QpType::Rc, pd, cq, cq, 4)
        .map_err(|e| e.to_string())?;
    let my_psn = Psn::new((seed * 65_537) & 0xff_ffff);
    let e = |e: burst_verbs::engine::PostError| e.to_string();
    let gid: String = dev.gid().iter().map(|b| format!("{b:02x}")).collect();
    s.write_all(format!("{:06x} {:06x} {}\n", qpn.value(), my_psn.value(), gid).as_bytes())
        .map_err(|e| e.to_string())?;
    let mut params = RcParams::new(my_psn, mtu);
    params.rd_atomic = 16;
    let peer = RcPeer {
        gid: tgid,
        qpn: Qpn::from_wire(tqpn),
        psn: Psn::new(tpsn),
    };
    dev.connect_rc(qpn, &peer, &params)
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let read = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: vaddr,
            rkey,
        },
        [Sge {
            addr: mr.addr,
            length: half as u32,
            lkey: mr.lkey,
        }],
    );
    let write = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: vaddr + half as u64,
            rkey,
        },
        [Sge {
            addr: mr.addr + half as u64,
            length: (size - half) as u32,
            lkey: mr.lkey,
        }],
    );
    dev.post_send(qpn, &read).map_err(e)?;
    dev.post_send(qpn, &write).map_err(e)?;
    let deadline = start + Duration::from_secs(120);
    let mut done = 0;
    while done < 2 {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out; device {:?}; qp {:?}",
                dev.counters(),
                dev.describe_qps()
            ));
        }
        if let Some(wc) = dev.poll_cq(cq) {
            if wc.status != WcStatus::Success {
                return Err(format!("wr {} failed: {:?}", wc.wr_id, wc.status));
            }
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let counters = dev.counters().map_err(e)?;
    drop(dev);
    drop(engine);
    if let Some(bad) =
        (0..half).find(|&i| buf[i] != (i as u32).wrapping_mul(13).wrapping_add(7) as u8)
    {
        return Err(format!("READ data differs at byte {bad}"));
    }
    s.write_all(format!("check {seed}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    line.clear();
    rd.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "ok" {
        return Err(format!("target says {:?} about the WRITE", line.trim()));
    }
    println!(
        "rdma_rw: READ {half} B and WRITE {} B against QPN 0x{tqpn:06x} rkey 0x{rkey:x} in {:.3} s; both verified ({} packets sent (before -l's drops), {} received)",
        size - half,
        secs,
        counters.sent_pkts,
        counters.rcvd_pkts,
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma_rw: {e}");
            ExitCode::FAILURE
        }
    }
}
