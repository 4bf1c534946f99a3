//! The out-of-band exchange of rdma-core's ibv_*_pingpong examples, shared
//! by burst's rc_pingpong and ud_pingpong (included with `#[path]`).

use burst_wire::{Psn, Qpn};

/// "LID:QPN:PSN:GID" plus NUL, as pingpong.c formats it (52 bytes).
pub fn wire_msg(qpn: Qpn, psn: Psn, gid: [u8; 16]) -> Vec<u8> {
    let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
    let mut m = format!("{:04x}:{:06x}:{:06x}:{}", 0, qpn.value(), psn.value(), hex).into_bytes();
    m.push(0);
    m
}

pub fn parse_msg(m: &[u8]) -> Result<(Qpn, Psn, [u8; 16]), String> {
    let s = std::str::from_utf8(m)
        .map_err(|e| e.to_string())?
        .trim_end_matches('\0');
    let f: Vec<&str> = s.split(':').collect();
    if f.len() != 4 || f[3].len() != 32 {
        return Err(format!("bad peer message {s:?}"));
    }
    let qpn = u32::from_str_radix(f[1], 16).map_err(|e| e.to_string())?;
    let psn = u32::from_str_radix(f[2], 16).map_err(|e| e.to_string())?;
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok((Qpn::from_wire(qpn), Psn::new(psn), gid))
}

/// A peer's address as the exchange carries it.
pub type PeerAddr = (Qpn, Psn, [u8; 16]);

/// Runs the exchange in pingpong.c's order. A client sends its message,
/// reads the server's, says "done", then connects its QP; a server reads the
/// client's message, connects its QP (so it is ready before the client
/// sends), replies, and waits for "done".
pub fn exchange(
    server: Option<&str>,
    local: std::net::IpAddr,
    port: u16,
    msg: &[u8],
    connect: impl FnOnce(PeerAddr) -> Result<(), String>,
) -> Result<PeerAddr, String> {
    use std::io::{Read, Write};
    let mut peer = vec![0u8; msg.len()];
    match server {
        Some(server) => {
            let mut s = std::net::TcpStream::connect((server, port))
                .map_err(|e| format!("connect {server}:{port}: {e}"))?;
            s.write_all(msg).map_err(|e| e.to_string())?;
            s.read_exact(&mut peer)
                .map_err(|e| format!("reading peer address: {e}"))?;
            let p = parse_msg(&peer)?;
            s.write_all(b"done\0").map_err(|e| e.to_string())?;
            connect(p)?;
            Ok(p)
        }
        None => {
            let l = std::net::TcpListener::bind((local, port))
                .map_err(|e| format!("listen {local}:{port}: {e}"))?;
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            s.read_exact(&mut peer)
                .map_err(|e| format!("reading peer address: {e}"))?;
            let p = parse_msg(&peer)?;
            connect(p)?;
            s.write_all(msg).map_err(|e| e.to_string())?;
            let mut done = [0u8; 5];
            let _ = s.read_exact(&mut done);
            Ok(p)
        }
    }
}
