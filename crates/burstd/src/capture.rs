//! Live packet capture of the device's traffic to pcapng (`burst capture`):
//! the port's [`Tap`] copies each packet, and a thread writes them, with
//! the IP and UDP headers they travel in, to the descriptor the client
//! sent (a pipe the `burst` tool reads). Wireshark decodes them as RoCEv2.

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use burst_verbs::ports::{Captured, Tap};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

/// Packets queued between the data path and the writer at most (more are
/// not copied: a capture never slows the device down).
const QUEUE: usize = 8192;

/// The packet as it travelled: IPv4 or IPv6, UDP 4791, the RoCE bytes.
pub fn ip_packet(c: &Captured) -> Option<Vec<u8>> {
    let port = burst_wire::ROCEV2_PORT;
    let b = match (c.src, c.dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            etherparse::PacketBuilder::ipv4(s.ip().octets(), d.ip().octets(), 64).udp(port, port)
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            etherparse::PacketBuilder::ipv6(s.ip().octets(), d.ip().octets(), 64).udp(port, port)
        }
        _ => return None,
    };
    let mut out = Vec::with_capacity(b.size(c.bytes.len()));
    b.write(&mut out, &c.bytes).ok()?;
    Some(out)
}

/// Starts writing up to `packets` packets to `out` as pcapng; the capture
/// ends then, or when the reader goes away.
pub fn start(tap: Arc<Tap>, out: OwnedFd, packets: u64) -> std::io::Result<()> {
    let (tx, rx) = crossbeam_channel::bounded::<Captured>(QUEUE);
    let file = std::fs::File::from(out);
    let mut w = PcapNgWriter::new(std::io::BufWriter::new(file))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let idb = InterfaceDescriptionBlock {
        linktype: DataLink::RAW,
        snaplen: 0xffff,
        options: vec![],
    };
    w.write_pcapng_block(idb)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    tap.start(tx);
    std::thread::Builder::new()
        .name("burstd-capture".into())
        .spawn(move || {
            let mut n = 0u64;
            for c in rx.iter() {
                let Some(data) = ip_packet(&c) else { continue };
                let ts =
                    c.at.duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                let epb = EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: ts,
                    original_len: data.len() as u32,
                    data: data.into(),
                    options: vec![],
                };
                if w.write_pcapng_block(epb).is_err() || w.get_mut().flush().is_err() {
                    break;
                }
                n += 1;
                if n >= packets {
                    break;
                }
            }
            tap.stop();
            tracing::info!(packets = n, "capture ended");
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_get_the_headers_they_travelled_in() {
        let c = Captured {
            at: std::time::SystemTime::now(),
            sent: true,
            src: "198.18.0.1:4791".parse().unwrap(),
            dst: "198.18.0.2:4791".parse().unwrap(),
            bytes: vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1],
        };
        let p = ip_packet(&c).unwrap();
        let s = etherparse::SlicedPacket::from_ip(&p).unwrap();
        let Some(etherparse::TransportSlice::Udp(u)) = s.transport else {
            panic!("UDP expected");
        };
        assert_eq!(u.destination_port(), 4791);
        assert_eq!(u.payload(), &c.bytes[..]);
    }
}
