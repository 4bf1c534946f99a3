//! rsockets between two engines on loopback addresses: a stream larger
//! than both rings carried both ways (credits and new target SGEs cross
//! many times) and ended with EOF, the non-blocking calls (`EINPROGRESS`,
//! `EAGAIN`, readiness through `poll_ready`/`arm`), a refused connection,
//! and a connect request that is not an rsocket's refused by a listener.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use burst_verbs::engine::Engine;
use burst_verbs::rdma_cm::{CmEventKind, ConnParam, EventChannel, PortSpace, RdmaCm};
use burst_verbs::rsocket::{RSocket, Shutdown};
use burst_verbs::Mtu;

struct Side {
    _engine: Engine,
    cm: RdmaCm,
    ip: IpAddr,
}

fn side(ip: &str) -> Side {
    let ip: IpAddr = ip.parse().unwrap();
    let engine = Engine::start(ip, Mtu::Mtu1024).unwrap();
    let ctx = engine.context();
    let cm = RdmaCm::new(vec![ip], Box::new(move |_| Ok(ctx.clone())));
    Side {
        _engine: engine,
        cm,
        ip,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn a_stream_larger_than_the_rings_crosses_both_ways_and_ends_with_eof() {
    stream_both_ways("127.0.160.1", "127.0.160.2", 64);
}

#[test]
fn a_stream_without_inline_sends_its_credits_from_the_send_ring() {
    // rstream's bandwidth runs set RDMA_INLINE to 0: credits then go
    // through the send ring's control slots.
    stream_both_ways("127.0.160.9", "127.0.160.10", 0);
}

fn stream_both_ways(a_ip: &str, b_ip: &str, inline: i32) {
    let a = side(a_ip);
    let b = side(b_ip);
    let at = SocketAddr::new(b.ip, 7471);
    const LEN: usize = 1 << 20;
    let listener = RSocket::new(&b.cm).unwrap();
    listener
        .set_option(
            burst_verbs::rsocket::SOL_RDMA,
            burst_verbs::rsocket::RDMA_INLINE,
            inline,
        )
        .unwrap();
    listener.bind(at).unwrap();
    listener.listen().unwrap();
    let client_ip = a.ip;
    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        assert_eq!(s.peer_addr().map(|p| p.ip()), Some(client_ip));
        let mut got = vec![0u8; LEN];
        assert_eq!(s.recv(&mut got, libc::MSG_WAITALL).unwrap(), LEN);
        assert!(got == pattern(LEN, 1), "the stream arrived intact");
        // Back in odd-sized pieces.
        let mut sent = 0;
        for piece in got.chunks(70_001) {
            sent += s.send(piece, 0).unwrap();
        }
        assert_eq!(sent, LEN);
        // The client closes: EOF after the last byte.
        let mut tail = [0u8; 16];
        assert_eq!(s.recv(&mut tail, 0).unwrap(), 0, "EOF");
        drop(b);
    });
    let c = RSocket::new(&a.cm).unwrap();
    c.set_option(
        burst_verbs::rsocket::SOL_RDMA,
        burst_verbs::rsocket::RDMA_INLINE,
        inline,
    )
    .unwrap();
    c.connect(at).unwrap();
    assert!(c.is_connected());
    let data = pattern(LEN, 1);
    assert_eq!(c.send(&data, 0).unwrap(), LEN);
    let mut back = vec![0u8; LEN];
    let mut got = 0;
    while got < LEN {
        let n = c.recv(&mut back[got..], 0).unwrap();
        assert!(n > 0, "no EOF before the echo is complete");
        got += n;
    }
    assert!(back == data, "the echo arrived intact");
    c.shutdown(Shutdown::Both).unwrap();
    drop(c);
    server.join().unwrap();
}

/// Waits for `events` on `s` as `rpoll` does: look, arm, sleep, look again.
fn wait_for(s: &RSocket, events: i16) -> i16 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = s.poll_ready(events, true);
        if r != 0 {
            return r;
        }
        let (r, fds, n) = s.arm(events);
        if r != 0 {
            return r;
        }
        let mut p: Vec<libc::pollfd> = fds[..n]
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `p` holds `n` live pollfds.
        unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, 100) };
        assert!(Instant::now() < end, "no readiness within 10 s");
    }
}

/// Connects a non-blocking client on `a` to a non-blocking listener on
/// `b` as an event loop does (`EAGAIN`, `EINPROGRESS`, then readiness);
/// returns the listener, the client and the accepted socket.
fn connect_non_blocking(a: &Side, b: &Side) -> (RSocket, RSocket, RSocket) {
    let at = SocketAddr::new(b.ip, 7471);
    let listener = RSocket::new(&b.cm).unwrap();
    listener.set_nonblocking(true);
    listener.bind(at).unwrap();
    listener.listen().unwrap();
    assert_eq!(
        errno_of(&listener.accept().unwrap_err()),
        libc::EAGAIN,
        "no request yet"
    );
    let c = RSocket::new(&a.cm).unwrap();
    c.set_nonblocking(true);
    assert_eq!(errno_of(&c.connect(at).unwrap_err()), libc::EINPROGRESS);
    // The listener becomes readable with the request; the accepted socket
    // finishes its set-up when the RTU comes.
    assert_eq!(wait_for(&listener, libc::POLLIN), libc::POLLIN);
    let s = listener.accept().unwrap();
    assert_eq!(wait_for(&c, libc::POLLOUT), libc::POLLOUT);
    (listener, c, s)
}

#[test]
fn non_blocking_calls_say_again_and_readiness_wakes_the_poller() {
    let a = side("127.0.160.3");
    let b = side("127.0.160.4");
    let (_listener, c, s) = connect_non_blocking(&a, &b);
    assert_eq!(c.take_error(), 0);
    let mut buf = [0u8; 8];
    assert_eq!(errno_of(&c.recv(&mut buf, 0).unwrap_err()), libc::EAGAIN);
    assert_eq!(c.send(b"ping", 0).unwrap(), 4);
    assert_eq!(wait_for(&s, libc::POLLIN), libc::POLLIN);
    assert_eq!(s.recv(&mut buf, libc::MSG_PEEK).unwrap(), 4);
    assert_eq!(s.recv(&mut buf, 0).unwrap(), 4);
    assert_eq!(&buf[..4], b"ping");
    assert_eq!(errno_of(&s.recv(&mut buf, 0).unwrap_err()), libc::EAGAIN);
    // The client shuts its sending side: the server reads EOF and can
    // still answer.
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(wait_for(&s, libc::POLLIN) & libc::POLLIN, libc::POLLIN);
    assert_eq!(s.recv(&mut buf, 0).unwrap(), 0);
    assert_eq!(s.send(b"pong", 0).unwrap(), 4);
    assert_eq!(wait_for(&c, libc::POLLIN) & libc::POLLIN, libc::POLLIN);
    assert_eq!(c.recv(&mut buf, 0).unwrap(), 4);
    assert_eq!(&buf[..4], b"pong");
    assert_eq!(
        errno_of(&c.send(b"x", 0).unwrap_err()),
        libc::ECONNRESET,
        "no sending after SHUT_WR"
    );
}

/// A peer that sends and hangs up at once: its data is read before the
/// hang-up is reported to a reader (`POLLIN` alone, then `POLLIN |
/// POLLHUP` at EOF), as a TCP socket does; a writer hears of it at once.
/// (rstream's async mode takes `POLLHUP` for an error: it failed whenever
/// the last data and the disconnect came in one batch.)
#[test]
fn a_peers_last_data_is_read_before_its_hang_up_is_reported() {
    let a = side("127.0.160.9");
    let b = side("127.0.160.10");
    let (_listener, c, s) = connect_non_blocking(&a, &b);
    assert_eq!(s.send(b"last", 0).unwrap(), 4);
    s.shutdown(Shutdown::Both).unwrap();
    // The writer's view: the hang-up, once the disconnect came.
    let end = Instant::now() + Duration::from_secs(10);
    while wait_for(&c, libc::POLLOUT) & libc::POLLHUP == 0 {
        assert!(Instant::now() < end, "no hang-up within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The reader's: the data first, then EOF with the hang-up.
    assert_eq!(c.poll_ready(libc::POLLIN, false), libc::POLLIN);
    let mut buf = [0u8; 8];
    assert_eq!(c.recv(&mut buf, 0).unwrap(), 4);
    assert_eq!(&buf[..4], b"last");
    assert_eq!(
        c.poll_ready(libc::POLLIN, false),
        libc::POLLIN | libc::POLLHUP
    );
    assert_eq!(c.recv(&mut buf, 0).unwrap(), 0);
}

#[test]
fn a_connection_to_a_port_nobody_listens_on_is_refused() {
    let a = side("127.0.160.5");
    let b = side("127.0.160.6");
    // The peer runs rdma_cm (a listener on another port), so its CM
    // answers.
    let other = RSocket::new(&b.cm).unwrap();
    other.bind(SocketAddr::new(b.ip, 7471)).unwrap();
    other.listen().unwrap();
    let c = RSocket::new(&a.cm).unwrap();
    let e = c.connect(SocketAddr::new(b.ip, 7499)).unwrap_err();
    assert_eq!(errno_of(&e), libc::ECONNREFUSED);
    assert_eq!(c.take_error(), libc::ECONNREFUSED);
    let mut buf = [0u8; 4];
    assert_eq!(errno_of(&c.recv(&mut buf, 0).unwrap_err()), libc::ENOTCONN);
    drop(b);
}

#[test]
fn a_request_that_is_not_an_rsockets_is_rejected() {
    let a = side("127.0.160.7");
    let b = side("127.0.160.8");
    let at = SocketAddr::new(b.ip, 7471);
    let listener = RSocket::new(&b.cm).unwrap();
    listener.set_nonblocking(true);
    listener.bind(at).unwrap();
    listener.listen().unwrap();
    // A plain rdma_cm client whose private data is too short to be
    // rsocket's connection data.
    let ch = EventChannel::new().unwrap();
    let id = a.cm.create_id(&ch, PortSpace::Tcp);
    id.resolve_addr(None, at).unwrap();
    let next = |want: CmEventKind| {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            // The listener takes requests only when asked.
            let _ = listener.accept();
            if let Ok(e) = ch.get_event() {
                assert_eq!(e.kind, want, "{e:?}");
                return e;
            }
            assert!(Instant::now() < end, "no {want:?} within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // (The channel blocks: only read it once its descriptor is readable.)
    let ready = |ch: &EventChannel| {
        use std::os::fd::{AsFd, AsRawFd};
        let mut p = libc::pollfd {
            fd: ch.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    };
    while !ready(&ch) {
        std::thread::sleep(Duration::from_millis(1));
    }
    next(CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    while !ready(&ch) {
        std::thread::sleep(Duration::from_millis(1));
    }
    next(CmEventKind::RouteResolved);
    let p = ConnParam {
        private_data: b"not an rsocket".to_vec(),
        qp_num: 0x1234,
        ..ConnParam::default()
    };
    id.connect(Some(&p)).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !ready(&ch) {
        let _ = listener.accept();
        assert!(Instant::now() < end, "no answer within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    next(CmEventKind::Rejected);
    assert_eq!(
        errno_of(&listener.accept().unwrap_err()),
        libc::EAGAIN,
        "nothing was accepted"
    );
}

/// Sends or receives `buf` whole on a non-blocking socket, spinning on
/// `EAGAIN` as rstream does.
fn spin_xfer(s: &RSocket, buf: &mut [u8], send: bool) {
    let end = Instant::now() + Duration::from_secs(20);
    let mut at = 0;
    while at < buf.len() {
        let r = if send {
            s.send(&buf[at..], libc::MSG_DONTWAIT)
        } else {
            s.recv(&mut buf[at..], libc::MSG_DONTWAIT)
        };
        match r {
            Ok(0) if !send => panic!("EOF after {at} bytes"),
            Ok(n) => at += n,
            Err(e) if errno_of(&e) == libc::EAGAIN => {}
            Err(e) => panic!(
                "{} after {at} bytes: {e}",
                if send { "send" } else { "recv" }
            ),
        }
        assert!(Instant::now() < end, "stuck after {at} bytes");
    }
}

#[test]
fn many_small_messages_each_way_on_non_blocking_sockets_as_rstream_sends_them() {
    let a = side("127.0.160.11");
    let b = side("127.0.160.12");
    let at = SocketAddr::new(b.ip, 7471);
    let listener = RSocket::new(&b.cm).unwrap();
    listener
        .set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, 1 << 19)
        .unwrap();
    listener
        .set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 1 << 19)
        .unwrap();
    listener.set_nonblocking(true);
    listener.bind(at).unwrap();
    listener.listen().unwrap();
    let c = RSocket::new(&a.cm).unwrap();
    c.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, 1 << 19)
        .unwrap();
    c.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 1 << 19)
        .unwrap();
    c.set_nonblocking(true);
    assert_eq!(errno_of(&c.connect(at).unwrap_err()), libc::EINPROGRESS);
    let server = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(10);
        let s = loop {
            match listener.accept() {
                Ok(s) => break s,
                Err(e) if errno_of(&e) == libc::EAGAIN => assert!(Instant::now() < end),
                Err(e) => panic!("accept: {e}"),
            }
        };
        let mut sync = [0u8; 16];
        spin_xfer(&s, &mut sync, false);
        spin_xfer(&s, &mut sync, true);
        let mut m = [0u8; 64];
        let mut all = Vec::new();
        for _ in 0..1000 {
            spin_xfer(&s, &mut m, false);
            all.extend_from_slice(&m);
        }
        for piece in all.chunks_mut(64) {
            spin_xfer(&s, piece, true);
        }
        // The socket before its engine: its close waits for its last
        // sends' acknowledgements.
        drop(s);
        drop(b);
    });
    assert_eq!(wait_for(&c, libc::POLLOUT), libc::POLLOUT);
    assert_eq!(c.take_error(), 0);
    let mut sync = *b"0123456789abcdef";
    spin_xfer(&c, &mut sync, true);
    spin_xfer(&c, &mut sync, false);
    assert_eq!(&sync, b"0123456789abcdef");
    let data = pattern(64_000, 3);
    for piece in data.chunks(64) {
        spin_xfer(&c, &mut piece.to_vec(), true);
    }
    let mut back = vec![0u8; 64_000];
    for piece in back.chunks_mut(64) {
        spin_xfer(&c, piece, false);
    }
    assert!(back == data, "the echo arrived intact");
    server.join().unwrap();
}

#[test]
fn riowrite_lands_in_the_peers_mapped_buffer() {
    use burst_verbs::rsocket::{RDMA_IOMAPSIZE, SOL_RDMA};
    let a = side("127.0.160.13");
    let b = side("127.0.160.14");
    let at = SocketAddr::new(b.ip, 7471);
    let listener = RSocket::new(&b.cm).unwrap();
    listener.set_option(SOL_RDMA, RDMA_IOMAPSIZE, 1).unwrap();
    listener.bind(at).unwrap();
    listener.listen().unwrap();
    const LEN: usize = 100_000;
    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        let mut mapped = vec![0u8; LEN];
        // SAFETY: `mapped` outlives the mapping (unmapped below).
        let off = unsafe { s.iomap(mapped.as_mut_ptr(), LEN, true, Some(0)) }.unwrap();
        assert_eq!(off, 0);
        // The entry goes with this send.
        assert_eq!(s.send(b"m", 0).unwrap(), 1);
        let mut done = [0u8; 1];
        assert_eq!(s.recv(&mut done, 0).unwrap(), 1);
        assert!(mapped == pattern(LEN, 7), "the peer's riowrite landed");
        s.iounmap(mapped.as_mut_ptr(), LEN).unwrap();
        assert_eq!(
            errno_of(&s.iounmap(mapped.as_mut_ptr(), LEN).unwrap_err()),
            libc::EINVAL
        );
        drop(s);
        drop(b);
    });
    let c = RSocket::new(&a.cm).unwrap();
    c.set_option(SOL_RDMA, RDMA_IOMAPSIZE, 1).unwrap();
    c.connect(at).unwrap();
    let mut m = [0u8; 1];
    assert_eq!(c.recv(&mut m, 0).unwrap(), 1);
    let data = pattern(LEN, 7);
    assert_eq!(
        c.iowrite(&data, LEN as u64, 0).unwrap(),
        0,
        "nothing is mapped past the buffer"
    );
    let mut at_off = 0;
    while at_off < LEN {
        at_off += c.iowrite(&data[at_off..], at_off as u64, 0).unwrap();
    }
    // Sends complete in order: this one after the writes.
    assert_eq!(c.send(b"d", 0).unwrap(), 1);
    server.join().unwrap();
}
