//! The `*_str` helpers and rate conversions: pure tables, same text as
//! rdma-core 44 (read from the strings of Debian's libibverbs.so.1).

use std::ffi::{c_char, c_int};

/// A NUL-terminated static string as `const char *`.
macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr().cast::<c_char>()
    };
}

unsafe extern "C" fn wc_status_str(status: c_int) -> *const c_char {
    match status {
        0 => cstr!("success"),
        1 => cstr!("local length error"),
        2 => cstr!("local QP operation error"),
        3 => cstr!("local EE context operation error"),
        4 => cstr!("local protection error"),
        5 => cstr!("Work Request Flushed Error"),
        6 => cstr!("memory management operation error"),
        7 => cstr!("bad response error"),
        8 => cstr!("local access error"),
        9 => cstr!("remote invalid request error"),
        10 => cstr!("remote access error"),
        11 => cstr!("remote operation error"),
        12 => cstr!("transport retry counter exceeded"),
        13 => cstr!("RNR retry counter exceeded"),
        14 => cstr!("local RDD violation error"),
        15 => cstr!("remote invalid RD request"),
        16 => cstr!("aborted error"),
        17 => cstr!("invalid EE context number"),
        18 => cstr!("invalid EE context state"),
        19 => cstr!("fatal error"),
        20 => cstr!("response timeout error"),
        21 => cstr!("general error"),
        22 => cstr!("TM error"),
        23 => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}
export!("ibv_wc_status_str", "IBVERBS_1.1", wc_status_str);

unsafe extern "C" fn event_type_str(event: c_int) -> *const c_char {
    match event {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}
export!("ibv_event_type_str", "IBVERBS_1.1", event_type_str);

unsafe extern "C" fn port_state_str(state: c_int) -> *const c_char {
    match state {
        0 => cstr!("no state change (NOP)"),
        1 => cstr!("down"),
        2 => cstr!("init"),
        3 => cstr!("armed"),
        4 => cstr!("active"),
        5 => cstr!("active defer"),
        _ => cstr!("unknown"),
    }
}
export!("ibv_port_state_str", "IBVERBS_1.1", port_state_str);

unsafe extern "C" fn node_type_str(t: c_int) -> *const c_char {
    match t {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}
export!("ibv_node_type_str", "IBVERBS_1.1", node_type_str);

/// `enum ibv_rate` → (multiple of 2.5 Gb/s, or -1 where the rate is not
/// a multiple, and Mb/s).
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];

unsafe extern "C" fn rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}
export!("ibv_rate_to_mult", "IBVERBS_1.0", rate_to_mult);

unsafe extern "C" fn mult_to_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0)
}
export!("mult_to_ibv_rate", "IBVERBS_1.0", mult_to_rate);

unsafe extern "C" fn rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}
export!("ibv_rate_to_mbps", "IBVERBS_1.1", rate_to_mbps);

unsafe extern "C" fn mbps_to_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
export!("mbps_to_ibv_rate", "IBVERBS_1.1", mbps_to_rate);

unsafe extern "C" fn event_str(event: c_int) -> *const c_char {
    match event {
        0 => cstr!("RDMA_CM_EVENT_ADDR_RESOLVED"),
        1 => cstr!("RDMA_CM_EVENT_ADDR_ERROR"),
        2 => cstr!("RDMA_CM_EVENT_ROUTE_RESOLVED"),
        3 => cstr!("RDMA_CM_EVENT_ROUTE_ERROR"),
        4 => cstr!("RDMA_CM_EVENT_CONNECT_REQUEST"),
        5 => cstr!("RDMA_CM_EVENT_CONNECT_RESPONSE"),
        6 => cstr!("RDMA_CM_EVENT_CONNECT_ERROR"),
        7 => cstr!("RDMA_CM_EVENT_UNREACHABLE"),
        8 => cstr!("RDMA_CM_EVENT_REJECTED"),
        9 => cstr!("RDMA_CM_EVENT_ESTABLISHED"),
        10 => cstr!("RDMA_CM_EVENT_DISCONNECTED"),
        11 => cstr!("RDMA_CM_EVENT_DEVICE_REMOVAL"),
        12 => cstr!("RDMA_CM_EVENT_MULTICAST_JOIN"),
        13 => cstr!("RDMA_CM_EVENT_MULTICAST_ERROR"),
        14 => cstr!("RDMA_CM_EVENT_ADDR_CHANGE"),
        15 => cstr!("RDMA_CM_EVENT_TIMEWAIT_EXIT"),
        _ => cstr!("UNKNOWN EVENT"),
    }
}
export!("rdma_event_str", "RDMACM_1.0", event_str);
