//! Devices and contexts: the device list from burst's configuration,
//! `ibv_open_device` (one engine per device per process, shared by its
//! contexts), and the device, port and GID queries.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use burst_verbs::config::Config;
use burst_verbs::engine::Engine;
use burst_verbs::gids::GID_TABLE_LEN;
use burst_verbs::{DeviceAttr, MAX_QP, MAX_QP_WR, MAX_SGE};

use crate::abi::*;
use crate::objects::*;
use crate::{guard, set_errno};

struct DevList {
    // Boxed: the application holds pointers into each device.
    #[allow(clippy::vec_box)]
    devs: Vec<Box<Dev>>,
}

// SAFETY: the list is immutable after construction; its raw pointers are
// never written.
unsafe impl Send for DevList {}
// SAFETY: as above.
unsafe impl Sync for DevList {}

fn fill(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
}

pub(crate) fn devices() -> &'static [Box<Dev>] {
    static LIST: OnceLock<DevList> = OnceLock::new();
    &LIST
        .get_or_init(|| {
            crate::init_logging();
            let (cfgs, daemon) = match Config::from_env() {
                Ok(c) => match &c.daemon {
                    // Daemon mode: the device is burstd's, whatever else
                    // is configured.
                    Some(path) => match burst_verbs::engine::Context::connect(path) {
                        Ok(ctx) => (
                            vec![ctx.config().clone()],
                            Some(Arc::new(crate::objects::DaemonLink::new(path.clone(), ctx))),
                        ),
                        Err(e) => {
                            eprintln!("{e} (unset BURST_DAEMON for an embedded engine)");
                            (Vec::new(), None)
                        }
                    },
                    None => (c.devices, None),
                },
                Err(e) => {
                    // The one place users learn why there is no device.
                    eprintln!("{e}");
                    (Vec::new(), None)
                }
            };
            let devs = cfgs
                .into_iter()
                .enumerate()
                .map(|(index, cfg)| {
                    // SAFETY: ibv_device is plain data; all-zero is valid.
                    let mut raw: ibv_device = unsafe { std::mem::zeroed() };
                    raw.node_type = 1; // IBV_NODE_CA
                    raw.transport_type = 0; // IBV_TRANSPORT_IB, as RoCE HCAs report
                    fill(&mut raw.name, &cfg.name);
                    fill(&mut raw.dev_name, &format!("uverbs{index}"));
                    fill(
                        &mut raw.dev_path,
                        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
                    );
                    fill(
                        &mut raw.ibdev_path,
                        &format!("/sys/class/infiniband/{}", cfg.name),
                    );
                    Box::new(Dev {
                        raw,
                        cfg,
                        index,
                        daemon: daemon.clone(),
                    })
                })
                .collect();
            DevList { devs }
        })
        .devs
}

fn dev_of(device: *mut ibv_device) -> Option<&'static Dev> {
    devices()
        .iter()
        .find(|d| ptr::eq(&d.raw, device))
        .map(|d| &**d)
}

unsafe extern "C" fn get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", ptr::null_mut(), || {
        let devs = devices();
        // SAFETY: calloc of n+1 pointers, freed by ibv_free_device_list.
        let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: i < len + 1 slots allocated above; the devices live
            // for the whole process.
            unsafe { *list.add(i) = ptr::from_ref(&d.raw).cast_mut() };
        }
        if !num.is_null() {
            // SAFETY: the caller passes a writable int (or NULL).
            unsafe { *num = devs.len() as c_int };
        }
        list
    })
}
export!("ibv_get_device_list", "IBVERBS_1.1", get_device_list);

unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from get_device_list's calloc (or is NULL).
    unsafe { libc::free(list.cast()) };
}
export!("ibv_free_device_list", "IBVERBS_1.1", free_device_list);

unsafe extern "C" fn get_device_name(device: *mut ibv_device) -> *const c_char {
    match dev_of(device) {
        Some(d) => d.raw.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            ptr::null()
        }
    }
}
export!("ibv_get_device_name", "IBVERBS_1.1", get_device_name);

unsafe extern "C" fn get_device_index(device: *mut ibv_device) -> c_int {
    dev_of(device).map_or(-1, |d| d.index as c_int)
}
export!("ibv_get_device_index", "IBVERBS_1.9", get_device_index);

fn attr_of(d: &Dev) -> DeviceAttr {
    DeviceAttr::for_gid(burst_verbs::gid_of(d.cfg.addr))
}

unsafe extern "C" fn get_device_guid(device: *mut ibv_device) -> u64 {
    // __be64: the GUID's bytes in network order.
    dev_of(device).map_or(0, |d| attr_of(d).node_guid.to_be())
}
export!("ibv_get_device_guid", "IBVERBS_1.1", get_device_guid);

/// The engine behind `d` and a context of it: the process's embedded
/// engine for the device, or (daemon mode) the burstd client.
fn context_for(d: &Dev) -> std::io::Result<(Option<Arc<Engine>>, burst_verbs::engine::Context)> {
    if let Some(link) = &d.daemon {
        let ctx = link.context()?;
        if ctx.device_failed() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "burstd is gone; restart the application once it is back",
            ));
        }
        return Ok((None, ctx));
    }
    let e = engine_for(d)?;
    let ctx = e.context();
    Ok((Some(e), ctx))
}

/// What this process runs: an embedded engine or a burstd client.
fn mode_of(d: &Dev) -> &'static str {
    if d.daemon.is_some() {
        "daemon"
    } else {
        "embedded"
    }
}

fn engine_for(d: &Dev) -> std::io::Result<Arc<Engine>> {
    static ENGINES: Mutex<Vec<(usize, Weak<Engine>)>> = Mutex::new(Vec::new());
    let mut all = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(e) = all
        .iter()
        .find(|(i, _)| *i == d.index)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(e);
    }
    let e = Arc::new(Engine::start_config(&d.cfg)?);
    all.push((d.index, Arc::downgrade(&e)));
    Ok(e)
}

/// The errno for an error opening a device: the OS's when it has one, else
/// the one its kind stands for (burst's messages wrap the OS error).
fn errno_of(e: &std::io::Error) -> libc::c_int {
    use std::io::ErrorKind as K;
    e.raw_os_error().unwrap_or(match e.kind() {
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::PermissionDenied => libc::EACCES,
        K::NotFound => libc::ENODEV,
        K::InvalidInput => libc::EINVAL,
        _ => libc::EIO,
    })
}

pub(crate) unsafe extern "C" fn open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", ptr::null_mut(), || {
        let Some(d) = dev_of(device) else {
            set_errno(libc::ENODEV);
            return ptr::null_mut();
        };
        let (engine, ctx) = match context_for(d) {
            Ok(e) => e,
            Err(e) => {
                // Address in use, not on this host, permission denied: say so.
                eprintln!("burst: cannot open {}: {e}", d.cfg.name);
                set_errno(errno_of(&e));
                return ptr::null_mut();
            }
        };
        // The context's own descriptor for the engine's events (closing it
        // with the context leaves the engine's).
        let async_fd = match ctx.async_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                return ptr::null_mut();
            }
        };
        // SAFETY: verbs_context is plain data (pointers and integers).
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        vctx.sz = size_of::<verbs_context>();
        vctx.ops[vop::QUERY_PORT] = crate::device::query_port_ex as Fp;
        vctx.ops[vop::QUERY_DEVICE_EX] = crate::device::query_device_ex as Fp;
        vctx.ops[vop::CREATE_QP_EX] = crate::verbs::create_qp_ex as Fp;
        vctx.ops[vop::CREATE_CQ_EX] = crate::verbs::create_cq_ex as Fp;
        let c = &mut vctx.context;
        c.device = ptr::from_ref(&d.raw).cast_mut();
        c.ops[op::COMPAT_QUERY_DEVICE] = query_device as Fp;
        c.ops[op::COMPAT_QUERY_PORT] = query_port as Fp;
        c.ops[op::ALLOC_MW] = crate::verbs::alloc_mw as Fp;
        c.ops[op::BIND_MW] = crate::datapath::bind_mw as Fp;
        c.ops[op::DEALLOC_MW] = crate::verbs::dealloc_mw as Fp;
        c.ops[op::POLL_CQ] = crate::datapath::poll_cq as Fp;
        c.ops[op::REQ_NOTIFY_CQ] = crate::datapath::req_notify_cq as Fp;
        c.ops[op::POST_SRQ_RECV] = crate::datapath::post_srq_recv as Fp;
        c.ops[op::POST_SEND] = crate::datapath::post_send as Fp;
        c.ops[op::POST_RECV] = crate::datapath::post_recv as Fp;
        // A real descriptor where libibverbs has its uverbs command file
        // (some applications dup or fcntl it); -1 only if even /dev/null
        // cannot be opened.
        let cmd_fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .ok()
            .map(std::os::fd::OwnedFd::from);
        c.cmd_fd = cmd_fd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd);
        c.async_fd = std::os::fd::AsRawFd::as_raw_fd(&async_fd);
        c.num_comp_vectors = 1;
        c.abi_compat = usize::MAX as *mut c_void; // __VERBS_ABI_IS_EXTENDED
        let b = Box::new(Ctx {
            vctx,
            dev: ptr::from_ref(d),
            engine,
            ctx,
            async_fd,
            cmd_fd,
            srqs: Mutex::new(HashMap::new()),
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
        });
        let p = Box::into_raw(b);
        tracing::info!(device = %d.cfg.name, addr = %d.cfg.addr, mode = mode_of(d), "device opened");
        // SAFETY: `p` is the live allocation made just above.
        unsafe { &raw mut (*p).vctx.context }
    })
}
export!("ibv_open_device", "IBVERBS_1.1", open_device);

unsafe extern "C" fn close_device(context: *mut ibv_context) -> c_int {
    guard("ibv_close_device", libc::EIO, || {
        // SAFETY: `context` came from open_device (caller's contract).
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: reclaims the Box made by open_device, once.
        drop(unsafe { Box::from_raw(ptr::from_ref(c).cast_mut()) });
        0
    })
}
export!("ibv_close_device", "IBVERBS_1.1", close_device);

fn fill_device_attr(c: &Ctx, a: &mut ibv_device_attr) {
    // SAFETY: `dev` points into the static device list.
    let d = unsafe { &*c.dev };
    let attr = attr_of(d);
    // SAFETY: plain data; all-zero is valid.
    *a = unsafe { std::mem::zeroed() };
    fill(
        &mut a.fw_ver,
        &format!("burst {} {}", env!("CARGO_PKG_VERSION"), mode_of(d)),
    );
    a.node_guid = attr.node_guid.to_be();
    a.sys_image_guid = attr.node_guid.to_be();
    a.max_mr_size = 1 << 40;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = attr.vendor_id;
    a.vendor_part_id = 0;
    a.max_qp = MAX_QP as c_int;
    a.max_qp_wr = MAX_QP_WR as c_int;
    // RC_RNR_NAK_GEN | SRQ_RESIZE | MEM_WINDOW | MEM_WINDOW_TYPE_2B (as RXE)
    a.device_cap_flags = (1 << 12) | (1 << 13) | (1 << 17) | (1 << 24);
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = MAX_SGE as c_int;
    a.max_cq = MAX_QP as c_int;
    a.max_cqe = MAX_CQE;
    a.max_mr = 1 << 24;
    a.max_mw = burst_verbs::MAX_WINDOWS as c_int;
    // RXE's multicast limits (groups, QPs per group, attachments in all).
    a.max_mcast_grp = 8192;
    a.max_mcast_qp_attach = 56;
    a.max_total_mcast_qp_attach = 0x70000;
    a.max_pd = 1 << 16;
    a.max_qp_rd_atom = attr.max_qp_rd_atom as c_int;
    a.max_res_rd_atom = (attr.max_qp_rd_atom * MAX_QP) as c_int;
    a.max_qp_init_rd_atom = attr.max_qp_rd_atom as c_int;
    a.atomic_cap = 1; // IBV_ATOMIC_HCA
    a.max_ah = 1 << 16;
    a.max_srq = attr.max_srq as c_int;
    a.max_srq_wr = attr.max_srq_wr as c_int;
    a.max_srq_sge = MAX_SGE as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
}

pub(crate) unsafe extern "C" fn query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `attr` is a writable ibv_device_attr (caller's contract).
        fill_device_attr(c, unsafe { &mut *attr });
        0
    })
}
export!("ibv_query_device", "IBVERBS_1.1", query_device);

/// `IB_UVERBS_DEVICE_ATOMIC_WRITE` of `device_cap_flags_ex`.
const DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

/// `verbs_context.query_device_ex`: the basic attributes, no extensions.
pub(crate) unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const u32,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard("ibv_query_device_ex", libc::EIO, || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` (struct ibv_query_device_ex_input) starts with comp_mask.
        if !input.is_null() && unsafe { *input } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let mut orig = std::mem::MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: zeroed plain data is a valid ibv_device_attr.
        let orig = unsafe { orig.assume_init_mut() };
        fill_device_attr(c, orig);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds attr_size bytes; we write n <= that.
        unsafe {
            ptr::write_bytes(attr.cast::<u8>(), 0, n);
            ptr::copy_nonoverlapping(
                ptr::from_ref(orig).cast::<u8>(),
                attr.cast::<u8>(),
                size_of::<ibv_device_attr>(),
            );
        }
        // The extensions a software device has: the capability flags again
        // plus RDMA ATOMIC WRITE (as RXE reports them) and the port count.
        let cap_flags_ex = u64::from(orig.device_cap_flags) | DEVICE_ATOMIC_WRITE;
        let ext: [(usize, &[u8]); 2] = [
            (280, &cap_flags_ex.to_ne_bytes()), // device_cap_flags_ex
            (396, &u32::from(orig.phys_port_cnt).to_ne_bytes()), // phys_port_cnt_ex
        ];
        for (off, bytes) in ext {
            if off + bytes.len() <= n {
                // SAFETY: inside the first n bytes of the caller's buffer.
                unsafe {
                    ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        attr.cast::<u8>().add(off),
                        bytes.len(),
                    )
                };
            }
        }
        0
    })
}

fn port_attr(c: &Ctx) -> ibv_port_attr {
    let p = c.ctx.query_port();
    ibv_port_attr {
        state: if p.active { 4 } else { 1 }, // ACTIVE, DOWN
        max_mtu: u32::from(p.max_mtu.ibv_mtu()),
        active_mtu: u32::from(p.active_mtu.ibv_mtu()),
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: 0x0401_0000, // CM_SUP | IP_BASED_GIDS
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 2,                          // 4X
        active_speed: 32,                         // EDR: the port claims 100 Gb/s
        phys_state: if p.active { 5 } else { 3 }, // LinkUp, Disabled
        link_layer: 2,                            // Ethernet
        ..Default::default()
    }
}

/// `ibv_query_port@IBVERBS_1.1`: the 48-byte compat layout, as rdma-core writes.
unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded contract; 48 bytes as struct _compat_ibv_port_attr.
    unsafe { query_port_ex(context, port, attr, 48) }
}
export!("ibv_query_port", "IBVERBS_1.1", query_port);

/// `verbs_context.query_port`: writes `min(len, 52)` bytes.
pub(crate) unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        if port != 1 || attr.is_null() {
            return libc::EINVAL;
        }
        let a = port_attr(c);
        let n = len.min(size_of::<ibv_port_attr>());
        // SAFETY: the caller's struct holds `len` bytes; we write n <= len.
        unsafe { ptr::copy_nonoverlapping(ptr::from_ref(&a).cast::<u8>(), attr.cast::<u8>(), n) };
        0
    })
}

/// What GID `index` of `port` holds: `Err(EINVAL)` past the table's
/// length or for a port other than 1, `Ok(None)` for an empty slot.
fn gid(c: &Ctx, port: u32, index: u32) -> Result<Option<[u8; 16]>, c_int> {
    if port != 1 || index as usize >= GID_TABLE_LEN {
        return Err(libc::EINVAL);
    }
    let table = c.ctx.gid_table().map_err(|_| libc::EIO)?;
    Ok(table.get(index as usize).copied().flatten())
}

/// `ibv_query_gid`: an empty slot reads as the zero GID (rdma-core keeps
/// that behaviour of the sysfs days).
unsafe extern "C" fn query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut [u8; 16],
) -> c_int {
    guard("ibv_query_gid", -1, || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let g = u32::try_from(index)
            .map_err(|_| libc::EINVAL)
            .and_then(|i| gid(c, port.into(), i));
        match g {
            Ok(g) if !out.is_null() => {
                // SAFETY: `out` is a writable union ibv_gid.
                unsafe { *out = g.unwrap_or([0; 16]) };
                0
            }
            Ok(_) => {
                set_errno(libc::EINVAL);
                -1
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}
export!("ibv_query_gid", "IBVERBS_1.1", query_gid);

fn ifindex(c: &Ctx) -> u32 {
    // SAFETY: `dev` points into the static device list.
    let d = unsafe { &*c.dev };
    let Some(name) = d.cfg.interface.as_deref() else {
        return 0;
    };
    let Ok(cname) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(cname.as_ptr()) }
}

/// One `ibv_gid_entry` of context `c`'s device for GID `index` = `g`.
fn gid_entry(c: &Ctx, index: u32, g: [u8; 16]) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: g,
        gid_index: index,
        port_num: 1,
        gid_type: 2, // IBV_GID_TYPE_ROCE_V2
        ndev_ifindex: ifindex(c),
    }
}

unsafe extern "C" fn query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        if entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match gid(c, port, index) {
            // SAFETY: the caller's entry holds entry_size >= 32 bytes.
            Ok(Some(g)) => unsafe { entry.write(gid_entry(c, index, g)) },
            Ok(None) => return libc::ENODATA,
            Err(e) => return e,
        }
        0
    })
}
export!("_ibv_query_gid_ex", "IBVERBS_1.11", query_gid_ex);

/// `ibv_query_gid_table`: the valid entries, in index order.
unsafe extern "C" fn query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        // SAFETY: caller's contract: a context of ours.
        let Some(c) = (unsafe { ctx_of(context) }) else {
            return -(libc::EINVAL as isize);
        };
        if entries.is_null() || entry_size < size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let Ok(table) = c.ctx.gid_table() else {
            return -(libc::EIO as isize);
        };
        let valid: Vec<(usize, [u8; 16])> = table
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.map(|g| (i, g)))
            .collect();
        if valid.len() > max_entries {
            // As the kernel: the caller's array is too small.
            return -(libc::EINVAL as isize);
        }
        for (k, (i, g)) in valid.iter().enumerate() {
            // SAFETY: the caller's array holds max_entries entries of
            // entry_size bytes; k < valid.len() <= max_entries.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(k * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(gid_entry(c, *i as u32, *g))
            };
        }
        valid.len() as isize
    })
}
export!("_ibv_query_gid_table", "IBVERBS_1.11", query_gid_table);

unsafe extern "C" fn query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    t: *mut c_int,
) -> c_int {
    // SAFETY: caller's contract: a context of ours.
    let ok = unsafe { ctx_of(context) }.map(|c| gid(c, port.into(), index));
    if !matches!(ok, Some(Ok(Some(_)))) || t.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: writable int; 1 = IBV_GID_TYPE_SYSFS_ROCE_V2.
    unsafe { *t = 1 };
    0
}
export!("ibv_query_gid_type", "IBVERBS_PRIVATE_34", query_gid_type);

/// rdma-core's logging hook for providers (`__verbs_log(ctx, level, fmt,
/// ...)`, void): another vendor's provider library that an application
/// loads beside burst (libfabric's EFA provider pulls in libefa, which
/// logs through it while it looks at devices that are not its own)
/// reaches it. rdma-core prints such messages only at its own debug level;
/// so does burst, without the message (a C format string and its
/// variadic arguments). The extra arguments of the C call are ignored
/// here, as the SysV ABI allows.
extern "C" fn verbs_log(_ctx: *mut c_void, level: u32, _fmt: *const c_char) {
    tracing::debug!(
        level,
        "a provider library logged through __verbs_log (not shown)"
    );
}
export!("__verbs_log", "IBVERBS_PRIVATE_34", verbs_log);

unsafe extern "C" fn query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: caller's contract: a context of ours.
    if unsafe { ctx_of(context) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: writable __be16: the default P_Key.
    unsafe { *pkey = 0xffff };
    0
}
export!("ibv_query_pkey", "IBVERBS_1.1", query_pkey);

unsafe extern "C" fn get_pkey_index(context: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: caller's contract: a context of ours.
    if unsafe { ctx_of(context) }.is_some() && port == 1 && pkey == 0xffff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}
export!("ibv_get_pkey_index", "IBVERBS_1.5", get_pkey_index);

/// `ibv_read_sysfs_file`: a burst device has no sysfs directory, so its
/// files are answered here (ibv_devinfo reads `board_id`); other paths are
/// read from the file system as rdma-core does.
unsafe extern "C" fn read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
        let ours = devices().iter().find(|d| {
            // SAFETY: ibdev_path is NUL-terminated (filled by us).
            let p = unsafe { CStr::from_ptr(d.raw.ibdev_path.as_ptr()) };
            p.to_string_lossy() == dir
        });
        let text: String = match ours {
            Some(d) => match file.as_ref() {
                "board_id" if d.daemon.is_some() => "BURST_SOFT_ROCE_BURSTD".into(),
                "board_id" => "BURST_SOFT_ROCE".into(),
                "fw_ver" => format!("{} {}", env!("CARGO_PKG_VERSION"), mode_of(d)),
                "hca_type" => "burst".into(),
                "hw_rev" => "0".into(),
                "node_type" => "1: CA".into(),
                "node_guid" => {
                    let g = attr_of(d).node_guid.to_be_bytes();
                    format!(
                        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
                        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
                    )
                }
                _ => return -1,
            },
            None => match std::fs::read_to_string(format!("{dir}/{file}")) {
                Ok(t) => t.trim_end_matches('\n').to_string(),
                Err(_) => return -1,
            },
        };
        let n = text.len().min(size - 1);
        // SAFETY: `buf` holds `size` bytes; we write n + 1 <= size.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
        n as c_int
    })
}
export!("ibv_read_sysfs_file", "IBVERBS_1.0", read_sysfs_file);

unsafe extern "C" fn fork_init() -> c_int {
    // Nothing is pinned: registered memory is plain process memory.
    0
}
export!("ibv_fork_init", "IBVERBS_1.1", fork_init);

unsafe extern "C" fn is_fork_initialized() -> c_int {
    2 // IBV_FORK_UNNEEDED
}
export!(
    "ibv_is_fork_initialized",
    "IBVERBS_1.13",
    is_fork_initialized
);

unsafe extern "C" fn fork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
export!("ibv_dontfork_range", "IBVERBS_1.1", fork_range);

unsafe extern "C" fn dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
export!("ibv_dofork_range", "IBVERBS_1.1", dofork_range);

/// Called by the constructors of libmlx5/libefa (which perftest links):
/// there is no provider to register, and nothing to do.
unsafe extern "C" fn register_driver_34(_ops: *const c_void) {}
export!(
    "verbs_register_driver_34",
    "IBVERBS_PRIVATE_34",
    register_driver_34
);

#[allow(non_upper_case_globals)]
static mut verbs_allow_disassociate_destroy: u8 = 0;
core::arch::global_asm!(
    ".globl {0}",
    ".symver {0}, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34",
    sym verbs_allow_disassociate_destroy,
);

#[cfg(test)]
mod tests {
    use super::errno_of;

    #[test]
    fn a_taken_address_is_eaddrinuse_not_eio() {
        let held = std::net::UdpSocket::bind("127.0.84.1:4791").unwrap();
        let Err(e) = burst_verbs::engine::Engine::start(
            held.local_addr().unwrap().ip(),
            burst_verbs::Mtu::Mtu1024,
        ) else {
            panic!("the port is taken");
        };
        assert_eq!(errno_of(&e), libc::EADDRINUSE);
        let msg = e.to_string();
        assert!(msg.contains("BURST_ADDR"), "says what to change: {msg}");
        let e = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "x");
        assert_eq!(errno_of(&e), libc::EADDRNOTAVAIL);
        assert_eq!(
            errno_of(&std::io::Error::from_raw_os_error(libc::EPERM)),
            libc::EPERM
        );
    }
}
