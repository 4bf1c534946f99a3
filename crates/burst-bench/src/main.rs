//! burst-bench: burst's main job on an embedded default.
//!
//! With no arguments it starts two burst endpoints on loopback addresses
//! (127.0.90.1 and 127.0.90.2, UDP port 4791 each, one thread each), connects
//! an RC QP pair, and measures RDMA WRITE bandwidth (64 KiB messages) and
//! SEND/RECV ping-pong latency (64 B), then the same over kernel TCP on
//! loopback, printing perftest-style lines and the ratios.
//!
//! ```text
//! cargo run --release -p burst-bench [-- --size BYTES --iters N --lat-iters N]
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::{Device, RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

const ALL: Access = Access(1 | 2 | 4 | 8);

struct Opts {
    size: usize,
    iters: u64,
    lat_iters: u64,
    depth: u64,
    a: IpAddr,
    b: IpAddr,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        size: 65536,
        iters: 4000,
        lat_iters: 20000,
        depth: 16,
        a: Ipv4Addr::new(127, 0, 90, 1).into(),
        b: Ipv4Addr::new(127, 0, 90, 2).into(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .ok_or(format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--size" | "-s" => o.size = v.parse().map_err(|e| format!("{e}"))?,
            "--iters" | "-n" => o.iters = v.parse().map_err(|e| format!("{e}"))?,
            "--lat-iters" => o.lat_iters = v.parse().map_err(|e| format!("{e}"))?,
            "--depth" => o.depth = v.parse().map_err(|e| format!("{e}"))?,
            "--addr-a" => o.a = v.parse().map_err(|e| format!("{e}"))?,
            "--addr-b" => o.b = v.parse().map_err(|e| format!("{e}"))?,
            s => return Err(format!("unknown option {s}")),
        }
        i += 2;
    }
    Ok(o)
}

/// What each side tells the other out of band.
#[derive(Clone, Copy)]
struct Peer {
    qpn: Qpn,
    psn: Psn,
    gid: [u8; 16],
    rkey: u32,
    addr: u64,
}

fn connect(d: &mut Device, qpn: Qpn, me: Peer, peer: Peer) -> Result<(), String> {
    let mut p = RcParams::new(me.psn, Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    p.min_rnr_timer = 1;
    p.rd_atomic = 16;
    d.connect_rc(
        qpn,
        RcPeer {
            gid: peer.gid,
            qpn: peer.qpn,
            psn: peer.psn,
        },
        &p,
    )
    .map_err(|e| e.to_string())
}

/// One endpoint thread: opens a device, exchanges addresses, runs `work`.
fn endpoint<T: Send + 'static>(
    ip: IpAddr,
    len: usize,
    psn: u32,
    tx: mpsc::Sender<Peer>,
    rx: mpsc::Receiver<Peer>,
    work: impl FnOnce(&mut Device, Qpn, &mut [u8], burst_mem::MrKeys, Peer) -> Result<T, String>
        + Send
        + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    std::thread::spawn(move || {
        let mut d = Device::open(ip, Mtu::Mtu4096).map_err(|e| e.to_string())?;
        let pd = d.alloc_pd();
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` outlives the device: both live to the end of this closure, the device dropped first.
        let mr =
            unsafe { d.reg_mr(pd, buf.as_mut_ptr(), buf.len(), ALL) }.map_err(|e| e.to_string())?;
        let qpn = d.create_qp(QpType::Rc, pd);
        let me = Peer {
            qpn,
            psn: Psn::new(psn),
            gid: d.gid(),
            rkey: mr.rkey,
            addr: mr.addr,
        };
        tx.send(me).map_err(|e| e.to_string())?;
        let peer = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        connect(&mut d, qpn, me, peer)?;
        let r = work(&mut d, qpn, &mut buf, mr, peer);
        drop(d);
        r
    })
}

fn wait_wc(d: &mut Device, qpn: Qpn, deadline: Instant) -> Result<WorkCompletion, String> {
    loop {
        if let Some(wc) = d.poll_cq(qpn) {
            if wc.status != WcStatus::Success {
                return Err(format!("completion error {:?}", wc.status));
            }
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err("timed out".into());
        }
    }
}

fn write_bw(o: &Opts) -> Result<f64, String> {
    let (ta, rb) = mpsc::channel();
    let (tb, ra) = mpsc::channel();
    let (size, iters, depth) = (o.size, o.iters, o.depth);
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let server = endpoint(o.b, size, 100, tb, rb, move |d, qpn, _, _, _| {
        // The target only makes progress (ACKs) until the writer is done.
        while stop_rx.try_recv().is_err() {
            d.progress();
        }
        let _ = qpn;
        Ok(0.0)
    });
    let client = endpoint(o.a, size, 200, ta, ra, move |d, qpn, _, mr, peer| {
        let sge = vec![Sge {
            addr: mr.addr,
            length: size as u32,
            lkey: mr.lkey,
        }];
        let start = Instant::now();
        let deadline = start + Duration::from_secs(120);
        let (mut posted, mut done) = (0u64, 0u64);
        while done < iters {
            while posted < iters && posted - done < depth {
                let wr = SendWr::new(
                    posted,
                    SendOp::Write {
                        remote_addr: peer.addr,
                        rkey: peer.rkey,
                    },
                    sge.clone(),
                );
                d.post_send(qpn, wr).map_err(|e| e.to_string())?;
                posted += 1;
            }
            wait_wc(d, qpn, deadline)?;
            done += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        Ok(size as f64 * iters as f64 * 8.0 / secs / 1e9)
    });
    let r = client.join().map_err(|_| "writer panicked".to_string())?;
    let _ = stop_tx.send(());
    server.join().map_err(|_| "target panicked".to_string())??;
    r
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn send_lat(o: &Opts) -> Result<Vec<f64>, String> {
    let (ta, rb) = mpsc::channel();
    let (tb, ra) = mpsc::channel();
    let iters = o.lat_iters;
    let size = 64usize;
    let pong = endpoint(o.b, size, 300, tb, rb, move |d, qpn, _, mr, _| {
        let sge = vec![Sge {
            addr: mr.addr,
            length: size as u32,
            lkey: mr.lkey,
        }];
        let deadline = Instant::now() + Duration::from_secs(120);
        for _ in 0..4 {
            d.post_recv(
                qpn,
                RecvWr {
                    wr_id: 0,
                    sg_list: sge.clone(),
                },
            )
            .map_err(|e| e.to_string())?;
        }
        for i in 0..iters {
            loop {
                let wc = wait_wc(d, qpn, deadline)?;
                if wc.is_recv() {
                    break;
                }
            }
            d.post_recv(
                qpn,
                RecvWr {
                    wr_id: 0,
                    sg_list: sge.clone(),
                },
            )
            .map_err(|e| e.to_string())?;
            let mut wr = SendWr::new(i, SendOp::Send, sge.clone());
            wr.signaled = false;
            d.post_send(qpn, wr).map_err(|e| e.to_string())?;
        }
        // let the last ACKs out
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until {
            d.progress();
        }
        Ok(Vec::<f64>::new())
    });
    let ping = endpoint(o.a, size, 400, ta, ra, move |d, qpn, _, mr, _| {
        let sge = vec![Sge {
            addr: mr.addr,
            length: size as u32,
            lkey: mr.lkey,
        }];
        let deadline = Instant::now() + Duration::from_secs(120);
        for _ in 0..4 {
            d.post_recv(
                qpn,
                RecvWr {
                    wr_id: 0,
                    sg_list: sge.clone(),
                },
            )
            .map_err(|e| e.to_string())?;
        }
        let mut half_rtt = Vec::with_capacity(iters as usize);
        for i in 0..iters {
            let t = Instant::now();
            let mut wr = SendWr::new(i, SendOp::Send, sge.clone());
            wr.signaled = false;
            d.post_send(qpn, wr).map_err(|e| e.to_string())?;
            loop {
                let wc = wait_wc(d, qpn, deadline)?;
                if wc.is_recv() {
                    break;
                }
            }
            half_rtt.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            d.post_recv(
                qpn,
                RecvWr {
                    wr_id: 0,
                    sg_list: sge.clone(),
                },
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(half_rtt)
    });
    let r = ping.join().map_err(|_| "ping panicked".to_string())?;
    pong.join().map_err(|_| "pong panicked".to_string())??;
    r
}

fn tcp_bw(o: &Opts) -> Result<f64, String> {
    let l = TcpListener::bind((o.b, 0)).map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let total = o.size as u64 * o.iters;
    let sink = std::thread::spawn(move || -> Result<(), String> {
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < total {
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        s.write_all(b"k").map_err(|e| e.to_string())
    });
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let msg = vec![7u8; o.size];
    let start = Instant::now();
    for _ in 0..o.iters {
        s.write_all(&msg).map_err(|e| e.to_string())?;
    }
    let mut k = [0u8; 1];
    s.read_exact(&mut k).map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    sink.join().map_err(|_| "sink panicked".to_string())??;
    Ok(total as f64 * 8.0 / secs / 1e9)
}

fn tcp_lat(o: &Opts) -> Result<Vec<f64>, String> {
    let l = TcpListener::bind((o.b, 0)).map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let iters = o.lat_iters;
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut b = [0u8; 64];
        for _ in 0..iters {
            s.read_exact(&mut b).map_err(|e| e.to_string())?;
            s.write_all(&b).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut b = [1u8; 64];
    let mut v = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t = Instant::now();
        s.write_all(&b).map_err(|e| e.to_string())?;
        s.read_exact(&mut b).map_err(|e| e.to_string())?;
        v.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    echo.join().map_err(|_| "echo panicked".to_string())??;
    Ok(v)
}

fn main() -> std::process::ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("burst-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let run = || -> Result<(), String> {
        println!("burst-bench: two burst endpoints on {} and {} (UDP 4791, RoCEv2), one thread each; kernel TCP on loopback alongside", o.a, o.b);
        println!("---------------------------------------------------------------------------------------");
        println!(
            "                    RDMA_Write BW Test (RC, MTU 4096, depth {})",
            o.depth
        );
        println!(" #bytes     #iterations    BW average[Gb/sec]   MsgRate[Mpps]");
        let bw = write_bw(&o)?;
        println!(
            " {:<10} {:<14} {:<20.2} {:.6}",
            o.size,
            o.iters,
            bw,
            bw * 1e9 / 8.0 / o.size as f64 / 1e6
        );
        let tbw = tcp_bw(&o)?;
        println!(
            " kernel TCP, same messages: {tbw:.2} Gb/sec; burst/TCP = {:.2}",
            bw / tbw
        );
        println!("---------------------------------------------------------------------------------------");
        println!("                    Send Latency Test (RC, 64 B, busy polling; half round trip)");
        println!(" #bytes #iterations    t_min[usec]    t_typical[usec]    t_p99[usec]");
        let mut l = send_lat(&o)?;
        let (min, p50, p99) = (
            percentile(&mut l, 0.0),
            percentile(&mut l, 0.5),
            percentile(&mut l, 0.99),
        );
        println!(
            " {:<6} {:<14} {:<14.2} {:<18.2} {:.2}",
            64, o.lat_iters, min, p50, p99
        );
        let mut t = tcp_lat(&o)?;
        let (tp50, tp99) = (percentile(&mut t, 0.5), percentile(&mut t, 0.99));
        println!(" kernel TCP (TCP_NODELAY, blocking): p50 {tp50:.2} usec, p99 {tp99:.2} usec; burst/TCP p50 = {:.2}", p50 / tp50);
        println!("---------------------------------------------------------------------------------------");
        Ok(())
    };
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("burst-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
