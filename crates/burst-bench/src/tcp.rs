//! The same measurements over kernel TCP: a stream of `size`-byte writes,
//! and a request/response of `size` bytes, busy-polled (non-blocking socket,
//! spinning on `read`, like for like with a busy-polling RDMA stack) or, in
//! event mode, with blocking sockets (the kernel wakes the thread).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::report::{Bw, Lat, Samples};

fn e(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |x| format!("tcp {what}: {x}")
}

/// Reads exactly `buf.len()` bytes from a non-blocking socket, spinning.
fn spin_read(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err("tcp: peer closed".into()),
            Ok(n) => got += n,
            Err(x) if x.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err("tcp: timed out".into());
                }
            }
            Err(x) => return Err(format!("tcp read: {x}")),
        }
    }
    Ok(())
}

fn spin_write(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), String> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(n) => put += n,
            Err(x) if x.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err("tcp: timed out".into());
                }
            }
            Err(x) => return Err(format!("tcp write: {x}")),
        }
    }
    Ok(())
}

/// The receiving end of the stream test: reads until the sender shuts
/// its side down, then answers one byte.
pub fn stream_sink(l: TcpListener) -> Result<u64, String> {
    let (mut s, _) = l.accept().map_err(e("accept"))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).map_err(e("read"))?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    s.write_all(b"k").map_err(e("write"))?;
    Ok(got)
}

/// Streams `iters` messages of `size` bytes (or for `duration`) to `to`.
pub fn stream(
    to: SocketAddr,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
) -> Result<Bw, String> {
    let mut s = TcpStream::connect(to).map_err(e("connect"))?;
    let msg = vec![7u8; size];
    let start = Instant::now();
    let mut sent = 0u64;
    while crate::report::more(start, duration, sent, iters) {
        s.write_all(&msg).map_err(e("write"))?;
        sent += 1;
    }
    // The sink acknowledges once it has read everything.
    s.shutdown(std::net::Shutdown::Write)
        .map_err(e("shutdown"))?;
    let mut k = [0u8; 1];
    s.read_exact(&mut k).map_err(e("read"))?;
    let secs = start.elapsed().as_secs_f64();
    Ok(Bw {
        test: "write_bw".into(),
        transport: "tcp".into(),
        bytes: size,
        iters: sent,
        gbps: sent as f64 * size as f64 * 8.0 / secs / 1e9,
        mpps: sent as f64 / secs / 1e6,
        secs,
        retransmitted_pkts: 0,
        retransmits_started: 0,
        ack_timeouts: 0,
        sr_probes: 0,
        sr_go_backs: 0,
        window_cuts: 0,
        rx_dropped: [0; 2],
        cpu_secs: 0.0,
        client_cpu_secs: 0.0,
        ns_per_pkt: [0.0; 2],
        cores_at_400g: [0.0; 2],
    })
}

/// The echoing end of the request/response test (blocking with `events`).
pub fn echo(l: TcpListener, size: usize, events: bool) -> Result<(), String> {
    let (mut s, _) = l.accept().map_err(e("accept"))?;
    s.set_nodelay(true).map_err(e("nodelay"))?;
    s.set_nonblocking(!events).map_err(e("nonblocking"))?;
    let mut b = vec![0u8; size];
    let far = Instant::now() + Duration::from_secs(3600);
    loop {
        match spin_read(&mut s, &mut b, far) {
            Ok(()) => spin_write(&mut s, &b, far)?,
            Err(_) => return Ok(()), // the client closed
        }
    }
}

/// Ping-pong of `size` bytes, busy-polled or (`events`) blocking: half
/// round trips.
pub fn pingpong(
    to: SocketAddr,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
    events: bool,
) -> Result<Lat, String> {
    let mut s = TcpStream::connect(to).map_err(e("connect"))?;
    s.set_nodelay(true).map_err(e("nodelay"))?;
    s.set_nonblocking(!events).map_err(e("nonblocking"))?;
    let mut b = vec![1u8; size];
    let mut h = Samples::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120) + duration.unwrap_or_default();
    let mut i = 0;
    while crate::report::more(start, duration, i, iters) {
        let t = Instant::now();
        spin_write(&mut s, &b, deadline)?;
        spin_read(&mut s, &mut b, deadline)?;
        h.record(t.elapsed().as_nanos() as u64 / 2);
        i += 1;
    }
    Ok(h.lat("send_lat", "tcp", size, true, events))
}
