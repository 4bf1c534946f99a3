//! A port wrapper that copies every packet it sends and receives to a
//! [`Tap`] while a capture is on: what `tcpdump` cannot see on a
//! kernel-bypass port (AF_XDP, DPDK), and on any port the packets exactly
//! as burst handed them over and got them. Off, it costs one relaxed
//! atomic load per burst.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crossbeam_channel::{Sender, TrySendError};

use crate::{PacketBuf, Port, RxBatch, RxMeta, RxVisit};

/// One copied packet: the transport bytes (BTH onwards) and its addresses.
#[derive(Debug, Clone)]
pub struct Captured {
    /// When it passed.
    pub at: SystemTime,
    /// Sent by this port (else received).
    pub sent: bool,
    /// Source address.
    pub src: SocketAddr,
    /// Destination address.
    pub dst: SocketAddr,
    /// The UDP payload: BTH, extension headers, payload, ICRC.
    pub bytes: Vec<u8>,
}

/// Where a [`CapturePort`] copies packets while a capture is on.
#[derive(Debug, Default)]
pub struct Tap {
    on: AtomicBool,
    sink: Mutex<Option<Sender<Captured>>>,
}

impl Tap {
    /// A tap, off.
    pub fn new() -> Arc<Tap> {
        Arc::default()
    }

    /// Starts copying packets into `sink` (a bounded channel: packets that
    /// find it full are not copied, and the data path never waits).
    /// Replaces an earlier sink.
    pub fn start(&self, sink: Sender<Captured>) {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
        self.on.store(true, Ordering::Release);
    }

    /// Stops copying.
    pub fn stop(&self) {
        self.on.store(false, Ordering::Release);
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether a capture is on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn copy(&self, packets: impl Iterator<Item = Captured>) {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = sink.as_ref() else {
            return;
        };
        for p in packets {
            match tx.try_send(p) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => {
                    // The reader left: the capture is over.
                    *sink = None;
                    self.on.store(false, Ordering::Release);
                    return;
                }
            }
        }
    }
}

/// A port whose traffic a [`Tap`] can copy.
#[derive(Debug)]
pub struct CapturePort<P> {
    inner: P,
    tap: Arc<Tap>,
}

impl<P: Port> CapturePort<P> {
    /// Wraps `inner`.
    pub fn new(inner: P, tap: Arc<Tap>) -> CapturePort<P> {
        CapturePort { inner, tap }
    }
}

/// A received packet as the tap keeps it.
fn received(local: SocketAddr, at: SystemTime, m: RxMeta, bytes: &[u8]) -> Captured {
    Captured {
        at,
        sent: false,
        src: m.peer,
        dst: m.dest.map_or(local, |ip| SocketAddr::new(ip, local.port())),
        bytes: bytes.to_vec(),
    }
}

impl<P: Port> Port for CapturePort<P> {
    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> std::io::Result<usize> {
        let (tap, local) = (&self.tap, self.inner.local_addr());
        self.inner.recv_frames(max, &mut |meta, bytes| {
            if tap.is_on() {
                let at = SystemTime::now();
                tap.copy(std::iter::once(received(local, at, meta, bytes)));
            }
            visit(meta, bytes);
        })
    }

    fn recv_batch(&mut self, rx: &mut RxBatch) -> std::io::Result<usize> {
        let n = self.inner.recv_batch(rx)?;
        if n > 0 && self.tap.is_on() {
            let (local, at) = (self.inner.local_addr(), SystemTime::now());
            self.tap
                .copy(rx.frames().map(|(m, b)| received(local, at, m, b)));
        }
        Ok(n)
    }

    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        self.inner.assign_ip_ids(bufs)
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> std::io::Result<usize> {
        let n = self.inner.send_burst(bufs)?;
        if n > 0 && self.tap.is_on() {
            let local = self.inner.local_addr();
            let at = SystemTime::now();
            self.tap
                .copy(bufs[..n.min(bufs.len())].iter().map(|b| Captured {
                    at,
                    sent: true,
                    src: b.src.map_or(local, |ip| SocketAddr::new(ip, local.port())),
                    dst: b.peer,
                    bytes: b.bytes().to_vec(),
                }));
        }
        Ok(n)
    }

    crate::forward_port_control!(self => self.inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimFaults, SimNet};

    #[test]
    fn a_tap_sees_both_directions_only_while_on() {
        let net = SimNet::new(1, SimFaults::default());
        let a: SocketAddr = "198.18.0.1:4791".parse().unwrap();
        let b: SocketAddr = "198.18.0.2:4791".parse().unwrap();
        let tap = Tap::new();
        let mut pa = CapturePort::new(net.port(a), Arc::clone(&tap));
        let mut pb = net.port(b);
        let mut buf = PacketBuf::new();
        buf.data[..4].copy_from_slice(b"RoCE");
        buf.len = 4;
        buf.peer = b;
        pa.send_burst(std::slice::from_ref(&buf)).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(16);
        tap.start(tx);
        pa.send_burst(std::slice::from_ref(&buf)).unwrap();
        net.advance(1_000_000_000);
        let mut batch = RxBatch::new(8);
        let _ = pb.recv_batch(&mut batch);
        buf.peer = a;
        pb.send_burst(std::slice::from_ref(&buf)).unwrap();
        net.advance(1_000_000_000);
        assert!(pa.recv_batch(&mut batch).unwrap() > 0);
        let got: Vec<Captured> = rx.try_iter().collect();
        assert_eq!(got.len(), 2, "one sent while on, one received");
        assert!(got[0].sent && got[0].dst == b && got[0].bytes == b"RoCE");
        assert!(!got[1].sent && got[1].src == b);
        drop(rx);
        pa.send_burst(std::slice::from_ref(&buf)).unwrap();
        assert!(!tap.is_on(), "the reader left: off");
    }
}
