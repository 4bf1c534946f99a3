//! ud_pingpong: rdma-core's `ibv_ud_pingpong` on burst (UD SENDs with a DETH,
//! Q_Key 0x11111111, 40-byte GRH area in every receive buffer), speaking its
//! out-of-band exchange so it runs against the unmodified tool.
//!
//! ```text
//! ud_pingpong --local IP [-p PORT] [-s SIZE] [-n ITERS] [-r RX_DEPTH] [SERVER]
//! ```

use std::net::{IpAddr, Ipv6Addr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::PostError;
use burst_wire::{Mtu, Psn};

#[path = "pingpong/oob.rs"]
mod oob;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut local, mut port, mut size, mut iters, mut rx_depth, mut server) =
        (None, 18515u16, 2048usize, 1000u64, 500u64, None);
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
            "-s" => size = v()?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" => iters = v()?.parse().map_err(|e| format!("-n: {e}"))?,
            "-r" => rx_depth = v()?.parse().map_err(|e| format!("-r: {e}"))?,
            "-g" | "-d" | "-i" => {}
            s if !s.starts_with('-') => {
                server = Some(s.to_string());
                i += 1;
                continue;
            }
            s => return Err(format!("unknown option {s}")),
        }
        i += 2;
    }
    let local = local.ok_or("--local IP is required")?;
    let rx_depth = rx_depth.min(iters.max(1));
    // BURST_DAEMON: burstd's device instead of an engine of our own.
    let (_engine, dev) = burst_verbs::engine::open_device(&burst_verbs::config::DeviceConfig {
        name: "burst0".into(),
        addr: local,
        interface: None,
        mtu: Mtu::Mtu1024,
        drop_every: 0,
        congestion_control: burst_cc::Algorithm::default(),
        port: Default::default(),
        dpdk: String::new(),
        threads: 1,
        copy: Default::default(),
        engine: Default::default(),
    })
    .map_err(|e| e.to_string())?;
    if size > Mtu::Mtu1024.bytes() {
        return Err(format!(
            "requested size {size} is larger than the port MTU 1024"
        ));
    }
    let pd = dev.alloc_pd();
    let mut buf = vec![0x7bu8; size + GRH];
    // SAFETY: `buf` outlives the engine (dropped first, at the end of `run`).
    let mr = unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }
        .map_err(|e| e.to_string())?;
    let cq = dev.create_cq(rx_depth as usize + 1);
    let qpn = dev
        .create_qp(QpType::Ud, pd, cq, cq, rx_depth.max(1) as usize)
        .map_err(|e| e.to_string())?;
    let e = |e: PostError| e.to_string();
    let v = |e: VerbsError| e.to_string();
    dev.modify_qp(
        qpn,
        &QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QKEY),
            ..Default::default()
        },
    )
    .map_err(e)?
    .map_err(v)?;
    let recv_sge: burst_transport::SgList = [Sge {
        addr: mr.addr,
        length: (size + GRH) as u32,
        lkey: mr.lkey,
    }]
    .into();
    let send_sge: burst_transport::SgList = [Sge {
        addr: mr.addr + GRH as u64,
        length: size as u32,
        lkey: mr.lkey,
    }]
    .into();
    for _ in 0..rx_depth {
        dev.post_recv(
            qpn,
            &RecvWr {
                wr_id: RECV_WRID,
                sg_list: recv_sge,
            },
        )
        .map_err(e)?;
    }
    let my_psn = Psn::new(std::process::id().wrapping_mul(2_654_435_761) & 0xff_ffff);
    let gid = dev.gid();
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
        qpn.value(),
        my_psn.value(),
        Ipv6Addr::from(gid)
    );
    let msg = oob::wire_msg(qpn, my_psn, gid);
    let mut ah = 0;
    let (rqpn, _rpsn, rgid) = oob::exchange(server.as_deref(), local, port, &msg, |(_, _, g)| {
        ah = dev.create_ah(g).map_err(e)?;
        dev.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
        )
        .map_err(e)?
        .map_err(v)?;
        dev.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(my_psn),
                ..Default::default()
            },
        )
        .map_err(e)?
        .map_err(v)
    })?;
    println!(
        "  remote address: LID 0x0000, QPN 0x{:06x}, GID {}",
        rqpn.value(),
        Ipv6Addr::from(rgid)
    );
    let post_send = || {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, send_sge);
        wr.ud = Some(UdDest {
            remote_qpn: rqpn,
            remote_qkey: QKEY,
            ah,
        });
        dev.post_send(qpn, &wr).map_err(|e| e.to_string())
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    let (mut scnt, mut rcnt, mut routs, mut pending) = (0u64, 0u64, rx_depth, RECV_WRID);
    if server.is_some() {
        post_send()?;
        pending |= SEND_WRID;
    }
    while rcnt < iters || scnt < iters {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {scnt} sends and {rcnt} receives; device {:?}",
                dev.counters()
            ));
        }
        let Some(wc) = dev.poll_cq(cq) else { continue };
        if wc.status != WcStatus::Success {
            return Err(format!(
                "failed status {:?} for wr_id {}",
                wc.status, wc.wr_id
            ));
        }
        match wc.wr_id {
            SEND_WRID => scnt += 1,
            RECV_WRID => {
                if wc.byte_len as usize != size + GRH || wc.grh.is_none() || wc.src_qp != rqpn {
                    return Err(format!("unexpected receive {wc:?}"));
                }
                rcnt += 1;
                routs -= 1;
                if routs <= 1 {
                    while routs < rx_depth {
                        dev.post_recv(
                            qpn,
                            &RecvWr {
                                wr_id: RECV_WRID,
                                sg_list: recv_sge,
                            },
                        )
                        .map_err(e)?;
                        routs += 1;
                    }
                }
            }
            other => return Err(format!("completion for unknown wr_id {other}")),
        }
        pending &= !wc.wr_id;
        if scnt < iters && pending == 0 {
            post_send()?;
            pending = RECV_WRID | SEND_WRID;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = size as f64 * iters as f64 * 2.0;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        secs,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        iters,
        secs,
        secs * 1e6 / iters as f64
    );
    drop(dev);
    if buf[GRH..].iter().any(|&b| b != 0x7b) {
        return Err("payload differs from the 0x7b pattern".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ud_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
