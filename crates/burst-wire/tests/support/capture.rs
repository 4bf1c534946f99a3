//! Reads pcap and pcapng files into link-layer frames. Shared by the
//! `pcap-check` example and the golden-packet tests (included with `#[path]`).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;

/// One captured frame with the link type of its interface.
pub struct Captured {
    /// Link type.
    pub link: DataLink,
    /// Frame bytes as captured.
    pub data: Vec<u8>,
}

impl Captured {
    /// The frame as an Ethernet frame or as an IP packet, for the codec.
    pub fn parse(&self) -> Result<burst_wire::RoceFrame<'_>, burst_wire::Error> {
        match self.link {
            DataLink::ETHERNET => burst_wire::RoceFrame::parse_ethernet(&self.data),
            DataLink::LINUX_SLL if self.data.len() >= 16 => {
                burst_wire::RoceFrame::parse_ip(&self.data[16..])
            }
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => {
                burst_wire::RoceFrame::parse_ip(&self.data)
            }
            _ => Err(burst_wire::Error::NotIp(0)),
        }
    }
}

/// Reads every packet of a pcap or pcapng file.
pub fn read_capture(path: &Path) -> Result<Vec<Captured>, String> {
    let mut f = BufReader::new(File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let f = BufReader::new(File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let mut out = Vec::new();
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut r = PcapNgReader::new(f).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut links = Vec::new();
        while let Some(block) = r.next_block() {
            match block.map_err(|e| format!("{}: {e}", path.display()))? {
                Block::InterfaceDescription(i) => links.push(i.linktype),
                Block::EnhancedPacket(p) => out.push(Captured {
                    link: links
                        .get(p.interface_id as usize)
                        .copied()
                        .unwrap_or(DataLink::ETHERNET),
                    data: p.data.into_owned(),
                }),
                Block::SimplePacket(p) => out.push(Captured {
                    link: links.first().copied().unwrap_or(DataLink::ETHERNET),
                    data: p.data.into_owned(),
                }),
                _ => {}
            }
        }
    } else {
        let mut r = PcapReader::new(f).map_err(|e| format!("{}: {e}", path.display()))?;
        let link = r.header().datalink;
        while let Some(p) = r.next_packet() {
            let p = p.map_err(|e| format!("{}: {e}", path.display()))?;
            out.push(Captured {
                link,
                data: p.data.into_owned(),
            });
        }
    }
    Ok(out)
}
