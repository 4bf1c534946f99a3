//! QP1, the general services interface: where connection management MADs
//! arrive and leave. Not a transport QP: the data plane hands every valid
//! UD SEND to QPN 1 (Q_Key 0x80010000, one 256-byte MAD) to a queue that
//! the connection manager reads, and sends the MADs the connection manager
//! queues, from QPN 1, as RXE and RNICs do. Both queues are bounded: a MAD
//! that finds one full is dropped and counted (the CM retransmits).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

use burst_wire::mad::{GSI_QKEY, MAD_LEN};
use burst_wire::{BthRepr, DethRepr, IbPacket, IbRepr, Opcode, Psn, Qpn};
use crossbeam::queue::ArrayQueue;

use crate::eventfd::EventFd;

/// QP1's number.
pub const GSI_QPN: u32 = 1;

/// MADs either queue holds at most.
const DEPTH: usize = 1024;

/// A MAD and the address it came from or goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GsiMad {
    /// The peer (its RoCEv2 GID is this address).
    pub peer: IpAddr,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

/// What QP1 counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// MADs received and queued for the CM.
    pub rcvd: u64,
    /// MADs sent.
    pub sent: u64,
    /// Packets to QP1 that were not a UD SEND ONLY with the GSI Q_Key and
    /// a whole MAD.
    pub malformed: u64,
    /// MADs dropped because a queue was full.
    pub dropped: u64,
}

/// QP1's two queues and the descriptor that is readable while MADs wait
/// for the CM (one count per MAD).
#[derive(Debug)]
pub struct Gsi {
    rx: ArrayQueue<GsiMad>,
    tx: ArrayQueue<GsiMad>,
    rx_fd: EventFd,
    rcvd: AtomicU64,
    sent: AtomicU64,
    malformed: AtomicU64,
    dropped: AtomicU64,
    psn: AtomicU64,
}

impl Gsi {
    /// Empty queues.
    pub fn new() -> std::io::Result<Gsi> {
        Ok(Gsi {
            rx: ArrayQueue::new(DEPTH),
            tx: ArrayQueue::new(DEPTH),
            rx_fd: EventFd::new()?,
            rcvd: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            psn: AtomicU64::new(0),
        })
    }

    /// Readable while received MADs wait ([`Gsi::recv`] takes one count).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.rx_fd)
    }

    /// The next received MAD.
    pub fn recv(&self) -> Option<GsiMad> {
        let m = self.rx.pop()?;
        self.rx_fd.drain();
        Some(m)
    }

    /// Queues a MAD to send; `false` (and counted) when the queue is full.
    /// The caller wakes the engine ([`crate::engine::Context::gsi_send`]).
    pub(crate) fn queue(&self, m: GsiMad) -> bool {
        if self.tx.push(m).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether MADs wait to be sent.
    pub(crate) fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// What QP1 counted.
    pub fn counters(&self) -> GsiCounters {
        GsiCounters {
            rcvd: self.rcvd.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// The data plane's receive side: a packet for QPN 1 from `peer`.
    pub(crate) fn receive<T: AsRef<[u8]>>(&self, peer: IpAddr, pkt: &IbPacket<T>) {
        let ok = pkt.opcode() == Opcode::UD_SEND_ONLY
            && pkt.deth().is_some_and(|d| d.qkey() == GSI_QKEY)
            && pkt.payload().len() >= MAD_LEN;
        if !ok {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut mad = [0u8; MAD_LEN];
        mad.copy_from_slice(&pkt.payload()[..MAD_LEN]);
        if self.rx.push(GsiMad { peer, mad }).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.rcvd.fetch_add(1, Ordering::Relaxed);
        self.rx_fd.signal();
    }

    /// The data plane's send side: the next MAD as a UD SEND ONLY packet
    /// (QPN 1 to QPN 1, GSI Q_Key, P_Key 0xffff) written into `buf`;
    /// returns its length and destination.
    pub(crate) fn transmit(&self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        let m = self.tx.pop()?;
        // QP1's PSNs only need to differ between packets (UD).
        let psn = self.psn.fetch_add(1, Ordering::Relaxed) as u32 & 0xff_ffff;
        let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::from_wire(GSI_QPN), Psn::new(psn));
        bth.pkey = 0xffff;
        let mut ib = IbRepr::new(bth);
        ib.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp: Qpn::from_wire(GSI_QPN),
        });
        ib.payload_len = MAD_LEN;
        let len = ib.buffer_len();
        if len > buf.len() || ib.emit(&mut buf[..len]).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let at = ib.header_len();
        buf[at..at + MAD_LEN].copy_from_slice(&m.mad);
        self.sent.fetch_add(1, Ordering::Relaxed);
        Some((len, SocketAddr::new(m.peer, burst_wire::ROCEV2_PORT)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_mad_is_received_and_other_packets_are_counted() {
        let gsi = Gsi::new().unwrap();
        let peer: IpAddr = "198.18.0.9".parse().unwrap();
        let mut mad = [7u8; MAD_LEN];
        mad[0] = 1;
        assert!(gsi.queue(GsiMad { peer, mad }));
        assert!(gsi.has_transmit());
        let mut buf = [0u8; 512];
        let (len, to) = gsi.transmit(&mut buf).unwrap();
        assert_eq!(to, SocketAddr::new(peer, 4791));
        let pkt = IbPacket::new_checked(&buf[..len]).unwrap();
        assert_eq!(pkt.bth().dest_qp().value(), 1);
        assert_eq!(pkt.deth().unwrap().src_qp().value(), 1);
        gsi.receive(peer, &pkt);
        assert_eq!(gsi.recv(), Some(GsiMad { peer, mad }));
        assert_eq!(gsi.recv(), None);
        // Another Q_Key: counted, not queued.
        let mut ib = IbRepr::new(BthRepr::new(
            Opcode::UD_SEND_ONLY,
            Qpn::from_wire(1),
            Psn::new(0),
        ));
        ib.deth = Some(DethRepr {
            qkey: 5,
            src_qp: Qpn::from_wire(9),
        });
        ib.payload_len = MAD_LEN;
        let len = ib.buffer_len();
        ib.emit(&mut buf[..len]).unwrap();
        gsi.receive(peer, &IbPacket::new_checked(&buf[..len]).unwrap());
        assert_eq!(gsi.recv(), None);
        let c = gsi.counters();
        assert_eq!((c.rcvd, c.sent, c.malformed, c.dropped), (1, 1, 1, 0));
    }
}
