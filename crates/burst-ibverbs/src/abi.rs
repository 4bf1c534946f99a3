//! `#[repr(C)]` mirrors of the libibverbs structures applications read and
//! write, as compiled with Debian 12's rdma-core 44 headers on x86_64.
//! Sizes and offsets are asserted at compile time against the values
//! measured with `offsetof` on the real headers (design/ibverbs-abi.md §2).

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

pub type Fp = *const c_void;

#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops` is 32 pointers; the ones apps call through.
pub mod op {
    pub const COMPAT_QUERY_DEVICE: usize = 0;
    pub const COMPAT_QUERY_PORT: usize = 1;
    pub const ALLOC_MW: usize = 7;
    pub const BIND_MW: usize = 8;
    pub const DEALLOC_MW: usize = 9;
    pub const POLL_CQ: usize = 11;
    pub const REQ_NOTIFY_CQ: usize = 12;
    pub const POST_SRQ_RECV: usize = 20;
    pub const POST_SEND: usize = 25;
    pub const POST_RECV: usize = 26;
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: [Fp; 32],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: [u64; 5],
    pub abi_compat: *mut c_void,
}

/// Slots of `struct verbs_context` before `sz` (index = offset / 8).
pub mod vop {
    pub const QUERY_PORT: usize = 0;
    pub const CREATE_CQ_EX: usize = 25;
    pub const QUERY_DEVICE_EX: usize = 27;
    pub const CREATE_QP_EX: usize = 33;
}

#[repr(C)]
pub struct verbs_context {
    pub ops: [Fp; 39],
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: [u64; 5],
    pub cond: [u64; 6],
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// What `struct ibv_cq_ex` adds after its `ibv_cq` (offset 128): the
/// current completion's status and wr_id, and the polling entry points.
#[repr(C)]
pub struct ibv_cq_ex_tail {
    pub comp_mask: u32,
    pub status: u32,
    pub wr_id: u64,
    pub start_poll: Fp,
    pub next_poll: Fp,
    pub end_poll: Fp,
    /// read_opcode … read_completion_wallclock_ns, 15 pointers (see `cqx`).
    pub read: [Fp; 15],
}

/// Slots of `ibv_cq_ex_tail::read`.
pub mod cqx {
    pub const OPCODE: usize = 0;
    pub const VENDOR_ERR: usize = 1;
    pub const BYTE_LEN: usize = 2;
    pub const IMM_DATA: usize = 3;
    pub const QP_NUM: usize = 4;
    pub const SRC_QP: usize = 5;
    pub const WC_FLAGS: usize = 6;
    pub const SLID: usize = 7;
    pub const SL: usize = 8;
    pub const DLID_PATH_BITS: usize = 9;
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: [u64; 5],
    pub cond: [u64; 6],
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: [u64; 5],
    pub cond: [u64; 6],
    pub events_completed: u32,
}

/// `struct ibv_qp_ex`: an `ibv_qp` followed by the `ibv_wr_*` entry points.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: u32,
    /// wr_atomic_cmp_swp … wr_atomic_write, 21 pointers (see `wrop`).
    pub ops: [Fp; 21],
}

/// Index of each `ibv_wr_*` pointer in [`ibv_qp_ex::ops`].
pub mod wrop {
    pub const ATOMIC_CMP_SWP: usize = 0;
    pub const ATOMIC_FETCH_ADD: usize = 1;
    pub const BIND_MW: usize = 2;
    pub const LOCAL_INV: usize = 3;
    pub const RDMA_READ: usize = 4;
    pub const RDMA_WRITE: usize = 5;
    pub const RDMA_WRITE_IMM: usize = 6;
    pub const SEND: usize = 7;
    pub const SEND_IMM: usize = 8;
    pub const SEND_INV: usize = 9;
    pub const SET_UD_ADDR: usize = 11;
    pub const SET_INLINE_DATA: usize = 13;
    pub const SET_INLINE_DATA_LIST: usize = 14;
    pub const SET_SGE: usize = 15;
    pub const SET_SGE_LIST: usize = 16;
    pub const START: usize = 17;
    pub const COMPLETE: usize = 18;
    pub const ABORT: usize = 19;
    pub const ATOMIC_WRITE: usize = 20;
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// Aligned 8 like C's `union ibv_gid` (it holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// imm_data (network order) or invalidated_rkey.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// imm_data (network order) or invalidate_rkey.
    pub imm_data: u32,
    /// `wr` union: rdma {remote_addr, rkey}, atomic {remote_addr,
    /// compare_add, swap, rkey}, ud {ah, remote_qpn, remote_qkey}.
    pub wr: [u64; 4],
    pub qp_type: [u32; 2],
    /// `bind_mw` {mw, rkey, bind_info} (or `tso`).
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// The `bind_mw` member of `ibv_send_wr`'s last union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

impl ibv_qp_init_attr_ex {
    /// The fields `ibv_create_qp` takes.
    pub fn base(&self) -> ibv_qp_init_attr {
        ibv_qp_init_attr {
            qp_context: self.qp_context,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_device_attr_ex`: `orig_attr` then 168 bytes of extensions,
/// all left zero (no ODP, timestamps, TSO, RSS, pacing, TM, DM).
#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub rest: [u64; 21],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct ibv_async_event {
    /// Union of cq / qp / srq / wq pointers and port_num.
    pub element: *mut c_void,
    pub event_type: u32,
}

#[repr(C)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
}

// Sizes and offsets measured on the real headers (design/ibverbs-abi.md §2).
const _: () = {
    assert!(size_of::<ibv_device>() == 664);
    assert!(offset_of!(ibv_device, transport_type) == 20);
    assert!(offset_of!(ibv_device, ibdev_path) == 408);
    // struct ibv_cq_ex: ibv_cq, then status@132, wr_id@136, start_poll@144,
    // read_opcode@168, read_dlid_path_bits@240, 288 bytes in all.
    assert!(size_of::<ibv_cq>() + size_of::<ibv_cq_ex_tail>() == 288);
    assert!(128 + offset_of!(ibv_cq_ex_tail, status) == 132);
    assert!(128 + offset_of!(ibv_cq_ex_tail, start_poll) == 144);
    assert!(128 + offset_of!(ibv_cq_ex_tail, read) + cqx::OPCODE * 8 == 168);
    assert!(128 + offset_of!(ibv_cq_ex_tail, read) + cqx::DLID_PATH_BITS * 8 == 240);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
    assert!(offset_of!(ibv_cq_init_attr_ex, wc_flags) == 32);
    assert!(offset_of!(verbs_context, ops) + vop::CREATE_CQ_EX * 8 == 200);
    assert!(size_of::<ibv_context>() == 328);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, num_comp_vectors) == 272);
    assert!(offset_of!(ibv_context, mutex) == 280);
    assert!(offset_of!(ibv_context, abi_compat) == 320);
    assert!(offset_of!(ibv_context, ops) + op::POLL_CQ * 8 == 96);
    assert!(offset_of!(ibv_context, ops) + op::REQ_NOTIFY_CQ * 8 == 104);
    assert!(offset_of!(ibv_context, ops) + op::POST_SRQ_RECV * 8 == 168);
    assert!(offset_of!(ibv_context, ops) + op::POST_SEND * 8 == 208);
    assert!(offset_of!(ibv_context, ops) + op::POST_RECV * 8 == 216);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, sz) == 312);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(vop::QUERY_DEVICE_EX * 8 == 216);
    assert!(vop::CREATE_QP_EX * 8 == 264);
    assert!(size_of::<ibv_pd>() == 16);
    assert!(size_of::<ibv_mr>() == 48);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(offset_of!(ibv_mr, rkey) == 40);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(offset_of!(ibv_cq, comp_events_completed) == 120);
    assert!(size_of::<ibv_srq>() == 128);
    assert!(offset_of!(ibv_srq, events_completed) == 120);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_qp, events_completed) == 152);
    assert!(size_of::<ibv_qp_ex>() == 352);
    assert!(offset_of!(ibv_qp_ex, wr_id) == 168);
    assert!(offset_of!(ibv_qp_ex, wr_flags) == 176);
    assert!(offset_of!(ibv_qp_ex, ops) == 184);
    assert!(size_of::<ibv_mw>() == 32);
    assert!(size_of::<ibv_mw_bind>() == 48);
    assert!(offset_of!(ibv_mw_bind, bind_info) == 16);
    assert!(offset_of!(ibv_send_wr, bind_mw) == 80);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::BIND_MW * 8 == 200);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::SEND * 8 == 240);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::SET_SGE * 8 == 304);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::START * 8 == 320);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::ABORT * 8 == 336);
    assert!(offset_of!(ibv_qp_ex, ops) + wrop::ATOMIC_WRITE * 8 == 344);
    assert!(size_of::<ibv_ah>() == 24);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(offset_of!(ibv_ah_attr, is_global) == 29);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, qp_num) == 28);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, qp_type) == 72);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(ibv_qp_init_attr, cap) == 32);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
    assert!(offset_of!(ibv_qp_init_attr_ex, comp_mask) == 60);
    assert!(offset_of!(ibv_qp_init_attr_ex, pd) == 64);
    assert!(offset_of!(ibv_qp_init_attr_ex, source_qpn) == 120);
    assert!(offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, max_rd_atomic) == 126);
    assert!(offset_of!(ibv_qp_attr, rnr_retry) == 132);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, vendor_id) == 96);
    assert!(offset_of!(ibv_device_attr, max_qp_rd_atom) == 144);
    assert!(offset_of!(ibv_device_attr, max_srq) == 212);
    assert!(offset_of!(ibv_device_attr, max_pkeys) == 224);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_device_attr_ex>() == 400);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_port_attr, lid) == 34);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(size_of::<ibv_grh>() == 40);
};
