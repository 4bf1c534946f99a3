//! librdmacm's structs as applications see them (x86_64, rdma-core 44;
//! offsets from `design/ibverbs-abi.md` §5.1, checked at compile time).

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use crate::abi::*;

/// `struct sockaddr_storage`: 128 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_storage(pub [u8; 128]);

impl Default for sockaddr_storage {
    fn default() -> Self {
        sockaddr_storage([0; 128])
    }
}

/// `union { struct rdma_ib_addr ibaddr; }`: sgid, dgid, pkey.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct rdma_ib_addr {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub pkey: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_addr {
    pub src_addr: sockaddr_storage,
    pub dst_addr: sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct ibv_sa_path_rec` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: u32,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: u32,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
/// Resolve through an IB subnet administrator (none on Ethernet).
pub const RAI_SA: c_int = 0x10;

/// librdmacm's `AF_IB` (`ib.h`): InfiniBand addresses, which burst has not.
pub const AF_IB: c_int = 27;

/// `enum ibv_qp_type`.
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;

const _: () = {
    assert!(size_of::<rdma_cm_id>() == 416);
    assert!(offset_of!(rdma_cm_id, route) == 32);
    assert!(
        offset_of!(rdma_cm_id, route)
            + offset_of!(rdma_route, addr)
            + offset_of!(rdma_addr, dst_addr)
            == 160
    );
    assert!(
        offset_of!(rdma_cm_id, route)
            + offset_of!(rdma_route, addr)
            + offset_of!(rdma_addr, ibaddr)
            == 288
    );
    assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, path_rec) == 328);
    assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, num_paths) == 336);
    assert!(offset_of!(rdma_cm_id, ps) == 344);
    assert!(offset_of!(rdma_cm_id, port_num) == 348);
    assert!(offset_of!(rdma_cm_id, event) == 352);
    assert!(offset_of!(rdma_cm_id, send_cq_channel) == 360);
    assert!(offset_of!(rdma_cm_id, srq) == 392);
    assert!(offset_of!(rdma_cm_id, pd) == 400);
    assert!(offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(offset_of!(rdma_cm_event, param) == 24);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(offset_of!(rdma_conn_param, qp_num) == 16);
    assert!(size_of::<rdma_ud_param>() == 56);
    assert!(offset_of!(rdma_ud_param, ah_attr) == 16);
    assert!(offset_of!(rdma_ud_param, qp_num) == 48);
    assert!(size_of::<rdma_addrinfo>() == 96);
    assert!(offset_of!(rdma_addrinfo, ai_next) == 88);
    assert!(size_of::<ibv_sa_path_rec>() == 64);
};

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// `rdma_cm_join_mc_attr_mask`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 4;

/// `rdma_cm_mc_join_flags`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;
