//! Two processes on one host, each with its own burst engine on its own
//! address, connect an RC QP pair and move data: RDMA WRITE of 1 MiB, then
//! a SEND with immediate each way. The test re-runs its own binary as the
//! two processes; their QPN/PSN/GID/rkey go through the parent (stdin/stdout),
//! standing in for the out-of-band exchange.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::engine::{Context, CqId, Engine};
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

const LEN: usize = 1 << 20;

fn pattern(i: usize) -> u8 {
    (i * 131 + (i >> 12)) as u8
}

fn wait(c: &Context, cq: CqId) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(w) = c.poll_cq(cq) {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            return w;
        }
        assert!(Instant::now() < deadline, "no completion");
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// One side: runs only when the parent starts this binary with BURST_ROLE.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("BURST_ROLE") else {
        return;
    };
    let server = role == "server";
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 88, if server { 1 } else { 2 }));
    let engine = Engine::start(ip, Mtu::Mtu4096).unwrap();
    let c = engine.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(16);
    let qpn = c.create_qp(QpType::Rc, pd, cq, cq, 16).unwrap();
    let mut buf: Vec<u8> = if server {
        vec![0; LEN]
    } else {
        (0..LEN).map(pattern).collect()
    };
    let mut small = vec![0u8; 64];
    // SAFETY: both roles drop `engine` (which joins its thread and closes
    // the device) explicitly before `buf` and `small` go out of scope.
    let (mr, ms) = unsafe {
        (
            c.reg_mr(pd, buf.as_mut_ptr(), LEN, Access(1 | 2 | 4))
                .unwrap(),
            c.reg_mr(pd, small.as_mut_ptr(), 64, Access(1)).unwrap(),
        )
    };
    let psn = if server { 0x10 } else { 0xfff_ff0 };
    let gid = std::net::Ipv6Addr::from(c.gid());
    println!(
        "\nOOB {} {} {} {} {}",
        qpn.value(),
        psn,
        gid,
        mr.rkey,
        mr.addr
    );
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    let peer_qpn = Qpn::new(f[0].parse().unwrap()).unwrap();
    let peer_psn: u32 = f[1].parse().unwrap();
    let peer_gid: std::net::Ipv6Addr = f[2].parse().unwrap();
    let (peer_rkey, peer_addr): (u32, u64) = (f[3].parse().unwrap(), f[4].parse().unwrap());
    let mut p = RcParams::new(Psn::new(psn), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: false,
    };
    let peer = RcPeer {
        gid: peer_gid.octets(),
        qpn: peer_qpn,
        psn: Psn::new(peer_psn),
    };
    let ah = c.create_ah(peer.gid).unwrap();
    for a in p.transitions(ah, &peer) {
        c.modify_qp(qpn, &a).unwrap().unwrap();
    }
    let recv = RecvWr {
        wr_id: 1,
        sg_list: [Sge {
            addr: ms.addr,
            length: 64,
            lkey: ms.lkey,
        }]
        .into(),
    };
    c.post_recv(qpn, &recv).unwrap();
    let send = |imm| {
        let wr = SendWr::new(2, SendOp::SendWithImm(imm), SgList::new());
        c.post_send(qpn, &wr).unwrap();
    };
    if server {
        let w = wait(&c, cq);
        assert_eq!((w.opcode, w.imm_data), (WcOpcode::Recv, Some(0xc11e)));
        send(0x5e7);
        wait(&c, cq);
        drop(engine);
        let bad = (0..LEN).filter(|&i| buf[i] != pattern(i)).count();
        assert_eq!(bad, 0, "bytes differ after the RDMA WRITE");
        println!("server ok");
    } else {
        let mut wr = SendWr::new(
            3,
            SendOp::Write {
                remote_addr: peer_addr,
                rkey: peer_rkey,
            },
            [Sge {
                addr: mr.addr,
                length: LEN as u32,
                lkey: mr.lkey,
            }],
        );
        wr.signaled = true;
        c.post_send(qpn, &wr).unwrap();
        send(0xc11e);
        let mut got = Vec::new();
        while got.len() < 3 {
            got.push(wait(&c, cq));
        }
        let recv = got.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
        assert_eq!(recv.imm_data, Some(0x5e7));
        // Stop the engine (it sends the last ACKs) before the buffers go.
        drop(engine);
        println!("client ok");
    }
}

#[test]
fn two_processes_on_one_host() {
    let exe = std::env::current_exe().unwrap();
    let spawn = |role: &str| {
        Command::new(&exe)
            .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env("BURST_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut server = spawn("server");
    let mut client = spawn("client");
    let mut sout = BufReader::new(server.stdout.take().unwrap());
    let mut cout = BufReader::new(client.stdout.take().unwrap());
    // The harness prints its own lines too; ours starts with "OOB ".
    let info = |r: &mut BufReader<std::process::ChildStdout>| loop {
        let mut l = String::new();
        assert!(r.read_line(&mut l).unwrap() > 0, "child ended early");
        if let Some(rest) = l.strip_prefix("OOB ") {
            return rest.to_string();
        }
    };
    let (si, ci) = (info(&mut sout), info(&mut cout));
    server
        .stdin
        .take()
        .unwrap()
        .write_all(ci.as_bytes())
        .unwrap();
    client
        .stdin
        .take()
        .unwrap()
        .write_all(si.as_bytes())
        .unwrap();
    let rest = |r: &mut BufReader<std::process::ChildStdout>| {
        let mut s = String::new();
        std::io::Read::read_to_string(r, &mut s).unwrap();
        s
    };
    let (so, co) = (rest(&mut sout), rest(&mut cout));
    let (ss, cs) = (server.wait().unwrap(), client.wait().unwrap());
    assert!(
        ss.success() && so.contains("server ok"),
        "server: {ss} {so}"
    );
    assert!(
        cs.success() && co.contains("client ok"),
        "client: {cs} {co}"
    );
}
