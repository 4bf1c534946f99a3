//! IB Communication Management MADs (IBA chapter 12): REQ, MRA, REJ, REP,
//! RTU, DREQ and DREP, as carried over RoCEv2 in UD SEND ONLY packets to QP1
//! (Q_Key [`GSI_QKEY`]).
//!
//! A MAD is 256 bytes: the 24-byte common MAD header, then the CM message.
//! Field offsets below are relative to the end of the MAD header, as in the
//! spec's tables 106-113. Reserved bits are ignored on parse and written as
//! zero; everything else round-trips.

use crate::error::{check_len, Result};
use crate::field::{set_u16, set_u24, set_u32, set_u64, u16_at, u24_at, u32_at, u64_at};
use crate::{Error, Psn, Qpn};

/// Size of every MAD.
pub const MAD_LEN: usize = 256;
/// Size of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Size of a CM message body.
pub const CM_BODY_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// Management class of communication management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version of IBA 1.2 (what the kernel's CM sends).
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD method "Send", used by every CM message.
pub const METHOD_SEND: u8 = 0x03;
/// The well-known Q_Key of QP1.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// CM attribute IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum CmAttr {
    /// Connection request.
    Req = 0x0010,
    /// Message receipt acknowledgement.
    Mra = 0x0011,
    /// Reject.
    Rej = 0x0012,
    /// Reply to a request.
    Rep = 0x0013,
    /// Ready to use.
    Rtu = 0x0014,
    /// Disconnect request.
    Dreq = 0x0015,
    /// Disconnect reply.
    Drep = 0x0016,
    /// Service ID resolution request (UD services).
    SidrReq = 0x0017,
    /// Service ID resolution reply.
    SidrRep = 0x0018,
}

impl CmAttr {
    fn from_u16(v: u16) -> Option<CmAttr> {
        Some(match v {
            0x0010 => CmAttr::Req,
            0x0011 => CmAttr::Mra,
            0x0012 => CmAttr::Rej,
            0x0013 => CmAttr::Rep,
            0x0014 => CmAttr::Rtu,
            0x0015 => CmAttr::Dreq,
            0x0016 => CmAttr::Drep,
            0x0017 => CmAttr::SidrReq,
            0x0018 => CmAttr::SidrRep,
            _ => return None,
        })
    }
}

/// The common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method (R bit included).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class specific.
    pub class_specific: u16,
    /// Transaction ID: a CM exchange keeps it across REQ/REP/RTU.
    pub transaction_id: u64,
    /// Attribute ID (the CM message type).
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM Send header for `attr` with `transaction_id`.
    pub fn cm(attr: CmAttr, transaction_id: u64) -> MadHeader {
        MadHeader {
            base_version: 1,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attr_id: attr as u16,
            attr_mod: 0,
        }
    }

    fn parse(b: &[u8]) -> MadHeader {
        MadHeader {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: u16_at(b, 4),
            class_specific: u16_at(b, 6),
            transaction_id: u64_at(b, 8),
            attr_id: u16_at(b, 16),
            attr_mod: u32_at(b, 20),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        set_u16(b, 4, self.status);
        set_u16(b, 6, self.class_specific);
        set_u64(b, 8, self.transaction_id);
        set_u16(b, 16, self.attr_id);
        set_u16(b, 18, 0);
        set_u32(b, 20, self.attr_mod);
    }
}

/// `width` bits of byte `at`, ending `shift` bits above the least significant bit.
fn bits(b: &[u8], at: usize, shift: u8, width: u8) -> u8 {
    (b[at] >> shift) & ((1u16 << width) - 1) as u8
}

fn set_bits(b: &mut [u8], at: usize, shift: u8, width: u8, v: u8) {
    let mask = (((1u16 << width) - 1) as u8) << shift;
    b[at] = (b[at] & !mask) | ((v << shift) & mask);
}

fn gid_at(b: &[u8], at: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    g
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Path information of a REQ (primary or alternate), 44 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// Local port LID (0 on RoCE).
    pub local_lid: u16,
    /// Remote port LID (0 on RoCE).
    pub remote_lid: u16,
    /// Local port GID (IPv4-mapped address on RoCEv2).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmPath {
    fn parse(b: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: u16_at(b, at),
            remote_lid: u16_at(b, at + 2),
            local_gid: gid_at(b, at + 4),
            remote_gid: gid_at(b, at + 20),
            flow_label: u32_at(b, at + 36) >> 12,
            packet_rate: bits(b, at + 39, 0, 6),
            traffic_class: b[at + 40],
            hop_limit: b[at + 41],
            sl: bits(b, at + 42, 4, 4),
            subnet_local: bits(b, at + 42, 3, 1) != 0,
            local_ack_timeout: bits(b, at + 43, 3, 5),
        }
    }

    fn emit(&self, b: &mut [u8], at: usize) -> Result<()> {
        if self.flow_label > 0xf_ffff {
            return Err(Error::OutOfRange("CM flow label"));
        }
        set_u16(b, at, self.local_lid);
        set_u16(b, at + 2, self.remote_lid);
        b[at + 4..at + 20].copy_from_slice(&self.local_gid);
        b[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        set_u32(b, at + 36, self.flow_label << 12);
        set_bits(b, at + 39, 0, 6, self.packet_rate);
        b[at + 40] = self.traffic_class;
        b[at + 41] = self.hop_limit;
        set_bits(b, at + 42, 4, 4, self.sl);
        set_bits(b, at + 42, 3, 1, u8::from(self.subnet_local));
        set_bits(b, at + 43, 3, 5, self.local_ack_timeout);
        Ok(())
    }
}

/// Transport service type requested by a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmTransport {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Reliable datagram.
    Rd,
    /// Reserved / extended (see the extended transport type).
    Other(u8),
}

impl CmTransport {
    fn from_bits(v: u8) -> CmTransport {
        match v {
            0 => CmTransport::Rc,
            1 => CmTransport::Uc,
            2 => CmTransport::Rd,
            v => CmTransport::Other(v),
        }
    }
    fn bits(self) -> u8 {
        match self {
            CmTransport::Rc => 0,
            CmTransport::Uc => 1,
            CmTransport::Rd => 2,
            CmTransport::Other(v) => v & 3,
        }
    }
}

/// Enhanced Connection Establishment options a REQ or REP carries, where
/// the kernel's CM puts them: the vendor ID in 24 reserved bits of the
/// message (REQ bytes 5-7; REP bytes 15, 19 and 23), the options in the
/// MAD header's attribute modifier. All zero from a CM or device without
/// ECE (RXE); a CM that does not know them ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmEce {
    /// IEEE OUI of the offering stack (24 bits).
    pub vendor_id: u32,
    /// The vendor's options.
    pub options: u32,
}

/// REQ: connection request (IBA table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReq {
    /// Requester's communication ID.
    pub local_comm_id: u32,
    /// Service ID (rdma_cm encodes the port space and port here).
    pub service_id: u64,
    /// Requester's CA GUID.
    pub local_ca_guid: u64,
    /// Requester's Q_Key.
    pub local_qkey: u32,
    /// Requester's QPN.
    pub local_qpn: Qpn,
    /// Responder resources (max RDMA READ/atomic the requester accepts as target).
    pub responder_resources: u8,
    /// Local EE context number (RD only).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EE context number (RD only).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport: CmTransport,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The PSN the requester's receive queue expects first: the
    /// responder's sends start here (how the kernel's CM, RXE and RNICs
    /// read it).
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4-bit IB encoding, 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// Requester uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: CmPath,
    /// Alternate path (all zero when none).
    pub alternate_path: CmPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm puts its IP addresses here).
    pub private_data: [u8; 92],
    /// ECE options ([`CmEce`]).
    pub ece: CmEce,
}

impl CmReq {
    fn parse(b: &[u8]) -> CmReq {
        CmReq {
            local_comm_id: u32_at(b, 0),
            service_id: u64_at(b, 8),
            local_ca_guid: u64_at(b, 16),
            local_qkey: u32_at(b, 28),
            local_qpn: Qpn::from_wire(u24_at(b, 32)),
            responder_resources: b[35],
            local_eecn: u24_at(b, 36),
            initiator_depth: b[39],
            remote_eecn: u24_at(b, 40),
            remote_cm_response_timeout: bits(b, 43, 3, 5),
            transport: CmTransport::from_bits(bits(b, 43, 1, 2)),
            end_to_end_flow_control: bits(b, 43, 0, 1) != 0,
            starting_psn: Psn::new(u24_at(b, 44)),
            local_cm_response_timeout: bits(b, 47, 3, 5),
            retry_count: bits(b, 47, 0, 3),
            pkey: u16_at(b, 48),
            path_mtu: bits(b, 50, 4, 4),
            rdc_exists: bits(b, 50, 3, 1) != 0,
            rnr_retry_count: bits(b, 50, 0, 3),
            max_cm_retries: bits(b, 51, 4, 4),
            srq: bits(b, 51, 3, 1) != 0,
            extended_transport_type: bits(b, 51, 0, 3),
            primary_path: CmPath::parse(b, 52),
            alternate_path: CmPath::parse(b, 96),
            sap_supported: bits(b, 139, 2, 1) != 0,
            private_data: array(b, 140),
            // The options come from the MAD header (`CmMad::parse`).
            ece: CmEce {
                vendor_id: u24_at(b, 5),
                options: 0,
            },
        }
    }

    fn emit(&self, b: &mut [u8]) -> Result<()> {
        set_u32(b, 0, self.local_comm_id);
        set_u24(b, 5, self.ece.vendor_id & 0xff_ffff);
        set_u64(b, 8, self.service_id);
        set_u64(b, 16, self.local_ca_guid);
        set_u32(b, 28, self.local_qkey);
        set_u24(b, 32, self.local_qpn.value());
        b[35] = self.responder_resources;
        set_u24(b, 36, self.local_eecn);
        b[39] = self.initiator_depth;
        set_u24(b, 40, self.remote_eecn);
        set_bits(b, 43, 3, 5, self.remote_cm_response_timeout);
        set_bits(b, 43, 1, 2, self.transport.bits());
        set_bits(b, 43, 0, 1, u8::from(self.end_to_end_flow_control));
        set_u24(b, 44, self.starting_psn.value());
        set_bits(b, 47, 3, 5, self.local_cm_response_timeout);
        set_bits(b, 47, 0, 3, self.retry_count);
        set_u16(b, 48, self.pkey);
        set_bits(b, 50, 4, 4, self.path_mtu);
        set_bits(b, 50, 3, 1, u8::from(self.rdc_exists));
        set_bits(b, 50, 0, 3, self.rnr_retry_count);
        set_bits(b, 51, 4, 4, self.max_cm_retries);
        set_bits(b, 51, 3, 1, u8::from(self.srq));
        set_bits(b, 51, 0, 3, self.extended_transport_type);
        self.primary_path.emit(b, 52)?;
        self.alternate_path.emit(b, 96)?;
        set_bits(b, 139, 2, 1, u8::from(self.sap_supported));
        b[140..232].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// REP: reply to a REQ (IBA table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRep {
    /// Responder's communication ID.
    pub local_comm_id: u32,
    /// Requester's communication ID.
    pub remote_comm_id: u32,
    /// Responder's Q_Key.
    pub local_qkey: u32,
    /// Responder's QPN.
    pub local_qpn: Qpn,
    /// Local EE context number (RD only).
    pub local_eecn: u32,
    /// The PSN the responder's receive queue expects first: the
    /// requester's sends start here.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Responder uses an SRQ.
    pub srq: bool,
    /// Responder's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; 196],
    /// ECE options ([`CmEce`]).
    pub ece: CmEce,
}

impl CmRep {
    fn parse(b: &[u8]) -> CmRep {
        CmRep {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            local_qkey: u32_at(b, 8),
            local_qpn: Qpn::from_wire(u24_at(b, 12)),
            local_eecn: u24_at(b, 16),
            starting_psn: Psn::new(u24_at(b, 20)),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: bits(b, 26, 3, 5),
            failover_accepted: bits(b, 26, 1, 2),
            end_to_end_flow_control: bits(b, 26, 0, 1) != 0,
            rnr_retry_count: bits(b, 27, 5, 3),
            srq: bits(b, 27, 4, 1) != 0,
            local_ca_guid: u64_at(b, 28),
            private_data: array(b, 36),
            ece: CmEce {
                vendor_id: u32::from(b[15]) << 16 | u32::from(b[19]) << 8 | u32::from(b[23]),
                options: 0,
            },
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_u32(b, 8, self.local_qkey);
        set_u24(b, 12, self.local_qpn.value());
        set_u24(b, 16, self.local_eecn);
        set_u24(b, 20, self.starting_psn.value());
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        set_bits(b, 26, 3, 5, self.target_ack_delay);
        set_bits(b, 26, 1, 2, self.failover_accepted);
        set_bits(b, 26, 0, 1, u8::from(self.end_to_end_flow_control));
        set_bits(b, 27, 5, 3, self.rnr_retry_count);
        set_bits(b, 27, 4, 1, u8::from(self.srq));
        set_u64(b, 28, self.local_ca_guid);
        b[36..232].copy_from_slice(&self.private_data);
        // The vendor ID in the reserved byte after each 24-bit field.
        let v = self.ece.vendor_id.to_be_bytes();
        (b[15], b[19], b[23]) = (v[1], v[2], v[3]);
    }
}

/// REJ: reject (IBA table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRej {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID (0 when rejecting a REQ unseen before).
    pub remote_comm_id: u32,
    /// Which message is rejected: 0 REQ, 1 REP, 2 other (2 bits).
    pub message_rejected: u8,
    /// Length of the additional rejection information (7 bits).
    pub reject_info_length: u8,
    /// Reason code (for example 28 = consumer reject, 8 = invalid service ID).
    pub reason: u16,
    /// Additional rejection information.
    pub ari: [u8; 72],
    /// Private data.
    pub private_data: [u8; 148],
}

impl CmRej {
    fn parse(b: &[u8]) -> CmRej {
        CmRej {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            message_rejected: bits(b, 8, 6, 2),
            reject_info_length: bits(b, 9, 1, 7),
            reason: u16_at(b, 10),
            ari: array(b, 12),
            private_data: array(b, 84),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_bits(b, 8, 6, 2, self.message_rejected);
        set_bits(b, 9, 1, 7, self.reject_info_length);
        set_u16(b, 10, self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..232].copy_from_slice(&self.private_data);
    }
}

/// MRA: message receipt acknowledgement (IBA table 107).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMra {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged: 0 REQ, 1 REP, 2 LAP (2 bits).
    pub message_mraed: u8,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; 222],
}

impl CmMra {
    fn parse(b: &[u8]) -> CmMra {
        CmMra {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            message_mraed: bits(b, 8, 6, 2),
            service_timeout: bits(b, 9, 3, 5),
            private_data: array(b, 10),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_bits(b, 8, 6, 2, self.message_mraed);
        set_bits(b, 9, 3, 5, self.service_timeout);
        b[10..232].copy_from_slice(&self.private_data);
    }
}

/// RTU, DREP: the two IDs and private data (IBA tables 111 and 113).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmIds {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

impl CmIds {
    fn parse(b: &[u8]) -> CmIds {
        CmIds {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            private_data: array(b, 8),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        b[8..232].copy_from_slice(&self.private_data);
    }
}

/// DREQ: disconnect request (IBA table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmDreq {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Receiver's QPN (or EECN).
    pub remote_qpn: Qpn,
    /// Private data.
    pub private_data: [u8; 220],
}

impl CmDreq {
    fn parse(b: &[u8]) -> CmDreq {
        CmDreq {
            local_comm_id: u32_at(b, 0),
            remote_comm_id: u32_at(b, 4),
            remote_qpn: Qpn::from_wire(u24_at(b, 8)),
            private_data: array(b, 12),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.local_comm_id);
        set_u32(b, 4, self.remote_comm_id);
        set_u24(b, 8, self.remote_qpn.value());
        b[12..232].copy_from_slice(&self.private_data);
    }
}

/// SIDR_REQ: asks which UD QP serves a service ID (IBA table 114).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmSidrReq {
    /// Requester's request ID (echoed in the reply).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (rdma_cm puts its IP addresses here).
    pub private_data: [u8; 216],
}

impl CmSidrReq {
    fn parse(b: &[u8]) -> CmSidrReq {
        CmSidrReq {
            request_id: u32_at(b, 0),
            pkey: u16_at(b, 4),
            service_id: u64_at(b, 8),
            private_data: array(b, 16),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.request_id);
        set_u16(b, 4, self.pkey);
        set_u64(b, 8, self.service_id);
        b[16..232].copy_from_slice(&self.private_data);
    }
}

/// SIDR_REP: the UD QP and Q_Key of a service, or why not (IBA table 115).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmSidrRep {
    /// The request ID of the SIDR_REQ answered.
    pub request_id: u32,
    /// 0 valid, 1 service ID not supported, 2 rejected by the service,
    /// 3 no QP, 4 redirect, 5 unsupported class version.
    pub status: u8,
    /// Length of the additional information.
    pub add_info_length: u8,
    /// The service's QPN.
    pub qpn: Qpn,
    /// Service ID.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Class port information (redirection).
    pub class_port_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; 136],
}

impl CmSidrRep {
    fn parse(b: &[u8]) -> CmSidrRep {
        CmSidrRep {
            request_id: u32_at(b, 0),
            status: b[4],
            add_info_length: b[5],
            qpn: Qpn::from_wire(u24_at(b, 8)),
            service_id: u64_at(b, 12),
            qkey: u32_at(b, 20),
            class_port_info: array(b, 24),
            private_data: array(b, 96),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        set_u32(b, 0, self.request_id);
        b[4] = self.status;
        b[5] = self.add_info_length;
        set_u24(b, 8, self.qpn.value());
        set_u64(b, 12, self.service_id);
        set_u32(b, 20, self.qkey);
        b[24..96].copy_from_slice(&self.class_port_info);
        b[96..232].copy_from_slice(&self.private_data);
    }
}

/// A CM message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage {
    /// Connection request.
    Req(CmReq),
    /// Message receipt acknowledgement.
    Mra(CmMra),
    /// Reject.
    Rej(CmRej),
    /// Reply.
    Rep(CmRep),
    /// Ready to use.
    Rtu(CmIds),
    /// Disconnect request.
    Dreq(CmDreq),
    /// Disconnect reply.
    Drep(CmIds),
    /// Service ID resolution request.
    SidrReq(CmSidrReq),
    /// Service ID resolution reply.
    SidrRep(CmSidrRep),
}

impl CmMessage {
    /// The attribute ID this message travels under.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
            CmMessage::SidrReq(_) => CmAttr::SidrReq,
            CmMessage::SidrRep(_) => CmAttr::SidrRep,
        }
    }

    /// The ECE options a REQ or REP carries (none for the others).
    pub fn ece(&self) -> CmEce {
        match self {
            CmMessage::Req(r) => r.ece,
            CmMessage::Rep(r) => r.ece,
            _ => CmEce::default(),
        }
    }
}

/// A whole CM MAD: header and message.
///
/// ```
/// use burst_wire::mad::*;
/// use burst_wire::Qpn;
/// let rtu = CmMad::new(7, CmMessage::Rtu(CmIds { local_comm_id: 1, remote_comm_id: 2, private_data: [0; 224] }));
/// let mut buf = [0u8; MAD_LEN];
/// rtu.emit(&mut buf).unwrap();
/// assert_eq!(CmMad::parse(&buf).unwrap(), rtu);
/// assert_eq!(buf[1], MGMT_CLASS_CM);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMad {
    /// MAD header; its attribute ID must match `message`.
    pub header: MadHeader,
    /// CM message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with a standard Send header.
    pub fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        let mut header = MadHeader::cm(message.attr(), transaction_id);
        header.attr_mod = message.ece().options;
        CmMad { header, message }
    }

    /// Parses a MAD (the payload of a UD SEND to QP1).
    pub fn parse(b: &[u8]) -> Result<CmMad> {
        check_len("MAD", b, MAD_LEN)?;
        let header = MadHeader::parse(&b[..MAD_HEADER_LEN]);
        if header.mgmt_class != MGMT_CLASS_CM {
            return Err(Error::BadMad("management class is not CM"));
        }
        if header.base_version != 1 {
            return Err(Error::BadMad("base version"));
        }
        let body = &b[MAD_HEADER_LEN..MAD_LEN];
        let attr = CmAttr::from_u16(header.attr_id).ok_or(Error::BadMad("attribute ID"))?;
        let options = header.attr_mod;
        let message = match attr {
            CmAttr::Req => {
                let mut req = CmReq::parse(body);
                req.ece.options = options;
                CmMessage::Req(req)
            }
            CmAttr::Mra => CmMessage::Mra(CmMra::parse(body)),
            CmAttr::Rej => CmMessage::Rej(CmRej::parse(body)),
            CmAttr::Rep => {
                let mut rep = CmRep::parse(body);
                rep.ece.options = options;
                CmMessage::Rep(rep)
            }
            CmAttr::Rtu => CmMessage::Rtu(CmIds::parse(body)),
            CmAttr::Dreq => CmMessage::Dreq(CmDreq::parse(body)),
            CmAttr::Drep => CmMessage::Drep(CmIds::parse(body)),
            CmAttr::SidrReq => CmMessage::SidrReq(CmSidrReq::parse(body)),
            CmAttr::SidrRep => CmMessage::SidrRep(CmSidrRep::parse(body)),
        };
        Ok(CmMad { header, message })
    }

    /// Writes the 256-byte MAD into `b`.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if b.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_LEN,
                have: b.len(),
            });
        }
        if self.header.attr_id != self.message.attr() as u16 {
            return Err(Error::BadMad("attribute ID does not match message"));
        }
        let b = &mut b[..MAD_LEN];
        b.fill(0);
        self.header.emit(&mut b[..MAD_HEADER_LEN]);
        let body = &mut b[MAD_HEADER_LEN..];
        match &self.message {
            CmMessage::Req(m) => m.emit(body)?,
            CmMessage::Mra(m) => m.emit(body),
            CmMessage::Rej(m) => m.emit(body),
            CmMessage::Rep(m) => m.emit(body),
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.emit(body),
            CmMessage::Dreq(m) => m.emit(body),
            CmMessage::SidrReq(m) => m.emit(body),
            CmMessage::SidrRep(m) => m.emit(body),
        }
        Ok(())
    }
}
