//! A DPDK ethdev queue as a [`FrameLink`] (feature `dpdk`): burst owns the
//! link, so the [`RawPort`] over it answers ARP and resolves its peers
//! itself ([`Resolution::Own`]); frames that are not RoCEv2 for burst are
//! counted and dropped (no TAP hand-off to the kernel).
//!
//! The bindings are generated at build time from Debian's libdpdk-dev
//! 22.11 (bindgen, with C wrappers for DPDK's inline fast path). The EAL is
//! started once per process from burst's configuration: by default
//! `--no-huge -m 512 --no-pci --file-prefix burst-<pid>` (no hugepages, no
//! PCI devices, a runtime directory of its own) plus the caller's
//! arguments, typically a virtual device (`--vdev=net_memif0,...`,
//! `net_af_packet0,iface=...`, `net_af_xdp0,...`, `net_tap0,...`).

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn,
    rustdoc::all
)]
pub(crate) mod sys {
    include!(concat!(env!("OUT_DIR"), "/dpdk_bindings.rs"));
}

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::raw::{FrameLink, RawPort, Resolution};
use crate::Readiness;

/// `RTE_ETH_RX_OFFLOAD_SCATTER` (a macro bindgen cannot see).
const RX_OFFLOAD_SCATTER: u64 = 1 << 13;
/// `RTE_ETH_TX_OFFLOAD_MULTI_SEGS`.
const TX_OFFLOAD_MULTI_SEGS: u64 = 1 << 15;
/// Packets one rx/tx burst call moves.
const BURST: usize = 32;

/// How a DPDK link is set up.
#[derive(Debug, Clone)]
pub struct DpdkConfig {
    /// EAL arguments after burst's defaults (vdevs, lcores, `--huge-dir`,
    /// ...). A later `-m`, `--file-prefix` or `--huge` choice overrides the
    /// default (see [`DpdkConfig::eal_args`]).
    pub eal: Vec<String>,
    /// The ethdev to use, by name (`net_memif0`); `None`: the first port.
    pub device: Option<String>,
    /// Bytes of packet data per mbuf (frames longer than this are chained).
    pub mbuf_data: u16,
    /// Mbufs in the pool.
    pub mbufs: u32,
    /// Rx and tx descriptors.
    pub descriptors: u16,
    /// The DMA device of the `dmadev` copy backend (`dma=NAME`).
    pub dma: Option<String>,
}

impl DpdkConfig {
    /// Defaults with these EAL arguments: the first port, 9216-byte mbufs
    /// (one per jumbo frame), 8191 of them, 1024 descriptors.
    pub fn new(eal: &[&str]) -> DpdkConfig {
        DpdkConfig {
            eal: eal.iter().map(|s| s.to_string()).collect(),
            device: None,
            mbuf_data: 9216,
            mbufs: 8191,
            descriptors: 1024,
            dma: None,
        }
    }

    /// Parses `BURST_DPDK`-style text: EAL arguments separated by spaces,
    /// with burst's own keys `device=NAME`, `mbuf=BYTES` and `dma=NAME`
    /// (the DMA device of the `dmadev` copy backend) among them.
    ///
    /// ```
    /// let c = burst_io::dpdk::DpdkConfig::parse("--vdev=net_memif0,role=server device=net_memif0 mbuf=3800");
    /// assert_eq!(c.eal, ["--vdev=net_memif0,role=server"]);
    /// assert_eq!((c.device.as_deref(), c.mbuf_data), (Some("net_memif0"), 3800));
    /// ```
    pub fn parse(text: &str) -> DpdkConfig {
        let mut c = DpdkConfig::new(&[]);
        for w in text.split_whitespace() {
            if let Some(d) = w.strip_prefix("device=") {
                c.device = Some(d.into());
            } else if let Some(d) = w.strip_prefix("dma=") {
                c.dma = Some(d.into());
            } else if let Some(m) = w.strip_prefix("mbuf=").and_then(|m| m.parse().ok()) {
                c.mbuf_data = m;
            } else {
                c.eal.push(w.into());
            }
        }
        c
    }

    /// The whole EAL command line: a program name, burst's defaults unless
    /// the caller set them, then the caller's arguments.
    pub fn eal_args(&self) -> Vec<String> {
        let has = |k: &str| self.eal.iter().any(|a| a.starts_with(k));
        let mut v = vec!["burst".to_string()];
        if !has("--huge") && !has("--in-memory") && !has("--no-huge") {
            v.push("--no-huge".into());
        }
        if !has("-m") && !has("--socket-mem") {
            v.extend(["-m".into(), "512".into()]);
        }
        if !has("--no-pci") && !has("-a") && !has("--allow") {
            v.push("--no-pci".into());
        }
        if !has("--file-prefix") && !has("--in-memory") {
            v.push(format!("--file-prefix=burst-{}", std::process::id()));
        }
        if !has("--log-level") {
            v.push("--log-level=warning".into());
        }
        v.extend(self.eal.iter().map(|a| with_memif_bsize(a)));
        v
    }
}

/// memif packet buffer size burst asks for when the caller gave none: one
/// RoCE frame of MTU 4096 with every header (Ethernet and VLAN, IPv6, UDP,
/// BTH and the largest extended header, ICRC: under 4,230 bytes) in one
/// buffer. memif's default (2,048) chains two or three buffers per frame,
/// and 9,216 (a jumbo frame) spreads the ring over more cache; measured
/// (docs/performance.md, issue 33): WRITE 64 KiB 32.3 Gb/s at 9,216 and
/// 31 at 2,048 against 35.6 at 4,352. Longer frames still arrive, chained.
pub const MEMIF_BSIZE: u32 = 4352;

/// `arg` with `bsize=`[`MEMIF_BSIZE`] added when it creates a memif device
/// without a buffer size of its own.
fn with_memif_bsize(arg: &str) -> String {
    // `--vdev=net_memif0,...`, or the value after a separate `--vdev`.
    let memif = arg
        .strip_prefix("--vdev=")
        .unwrap_or(arg)
        .starts_with("net_memif");
    if memif && !arg.split(',').any(|kv| kv.starts_with("bsize=")) {
        format!("{arg},bsize={MEMIF_BSIZE}")
    } else {
        arg.to_string()
    }
}

/// The EAL, started once per process (DPDK allows no second start).
static EAL: OnceLock<Result<(), String>> = OnceLock::new();

pub(crate) fn start_eal(args: &[String]) -> io::Result<()> {
    let r = EAL.get_or_init(|| {
        // rte_eal_init pins the calling thread to its main lcore's CPU;
        // burst's callers are application threads: give them back their
        // CPUs afterwards.
        // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is live and of the size passed.
        let got =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        // The EAL keeps argv: leak it.
        let c: Vec<*mut libc::c_char> = args
            .iter()
            .map(|a| CString::new(a.as_str()).unwrap_or_default().into_raw())
            .collect();
        let argv: &'static mut [*mut libc::c_char] = Vec::leak(c);
        // SAFETY: argc/argv describe live NUL-terminated strings kept forever.
        let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if got == 0 {
            // SAFETY: restoring the mask read above, for this thread.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        }
        if rc < 0 {
            Err(format!(
                "DPDK EAL did not start with {:?} (see DPDK's messages above; \
                 each process needs its own --file-prefix, and without hugepages --no-huge)",
                &args[1..]
            ))
        } else {
            Ok(())
        }
    });
    r.clone().map_err(io::Error::other)
}

/// A DPDK port queue with its mbuf pool.
pub struct DpdkLink {
    name: String,
    port: u16,
    /// The rx/tx queue pair this link uses (one per engine thread).
    queue: u16,
    /// Stops and closes the port when its last queue's link goes.
    _owner: std::sync::Arc<PortOwner>,
    pool: *mut sys::rte_mempool,
    mac: [u8; 6],
    /// Bytes of data an mbuf holds.
    room: usize,
    /// Scratch for frames split over (or joined from) several mbufs.
    scratch: Vec<u8>,
    /// Frames the device did not take and burst dropped.
    pub tx_dropped: u64,
}

// SAFETY: the pool pointer is owned by this link (one queue, used through
// `&mut self` only); DPDK's ethdev and mempool calls may be made from any
// thread, EAL or not.
unsafe impl Send for DpdkLink {}

fn errno(rc: i32, what: &str, name: &str) -> io::Error {
    let e = io::Error::from_raw_os_error(-rc);
    io::Error::new(e.kind(), format!("burst-io: DPDK {name}: {what}: {e}"))
}

impl DpdkLink {
    /// Starts the EAL (first call in the process) and opens `cfg`'s port
    /// with one rx and one tx queue.
    pub fn open(cfg: &DpdkConfig) -> io::Result<DpdkLink> {
        Ok(DpdkLink::open_queues(cfg, 1)?.remove(0))
    }

    /// Opens `cfg`'s port with `queues` rx/tx queue pairs, one link each
    /// (one per engine thread); the port stops when the last link goes.
    pub fn open_queues(cfg: &DpdkConfig, queues: u16) -> io::Result<Vec<DpdkLink>> {
        let queues = queues.max(1);
        start_eal(&cfg.eal_args())?;
        let port = match &cfg.device {
            Some(n) => {
                let c = CString::new(n.as_str())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
                let mut id = 0u16;
                // SAFETY: a NUL-terminated name and a live out-parameter.
                let rc = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
                if rc != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("burst-io: DPDK has no port named {n:?} (add its --vdev)"),
                    ));
                }
                id
            }
            None => {
                // SAFETY: plain query.
                if unsafe { sys::rte_eth_dev_count_avail() } == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "burst-io: DPDK found no port (give a --vdev in BURST_DPDK)",
                    ));
                }
                0
            }
        };
        let name = cfg
            .device
            .clone()
            .unwrap_or_else(|| format!("dpdk port {port}"));
        // SAFETY: zeroed plain C structs are valid; the calls fill them.
        let mut info: sys::rte_eth_dev_info = unsafe { std::mem::zeroed() };
        // SAFETY: a valid port id and a live out-parameter.
        let rc = unsafe { sys::rte_eth_dev_info_get(port, &mut info) };
        if rc != 0 {
            return Err(errno(rc, "device info", &name));
        }
        let room = usize::from(cfg.mbuf_data);
        // SAFETY: as above.
        let mut conf: sys::rte_eth_conf = unsafe { std::mem::zeroed() };
        if info.rx_offload_capa & RX_OFFLOAD_SCATTER != 0 {
            conf.rxmode.offloads |= RX_OFFLOAD_SCATTER;
        }
        if info.tx_offload_capa & TX_OFFLOAD_MULTI_SEGS != 0 {
            conf.txmode.offloads |= TX_OFFLOAD_MULTI_SEGS;
        }
        // SAFETY: a valid port and a live configuration.
        let rc = unsafe { sys::rte_eth_dev_configure(port, queues, queues, &conf) };
        if rc != 0 {
            return Err(errno(rc, "configure", &name));
        }
        // Jumbo frames where the device takes them (RoCE MTU 4096).
        let mtu = (room.min(9000) as u16).min(info.max_mtu.max(1500));
        // SAFETY: plain call on a configured port; failure is harmless.
        unsafe { sys::rte_eth_dev_set_mtu(port, mtu) };
        // Pools outlive their link (DPDK frees memzones only at exit): a
        // port opened again gets a pool of another name.
        static POOLS: AtomicU32 = AtomicU32::new(0);
        let nth = POOLS.fetch_add(1, Ordering::Relaxed);
        let pool_name = CString::new(format!("burst_pool_{port}_{nth}")).expect("no NUL");
        // SAFETY: plain calls; the result is checked.
        let pool = unsafe {
            sys::rte_pktmbuf_pool_create(
                pool_name.as_ptr(),
                cfg.mbufs * u32::from(queues),
                256,
                0,
                (room + sys::RTE_PKTMBUF_HEADROOM as usize).min(u16::MAX as usize) as u16,
                sys::rte_socket_id() as i32,
            )
        };
        if pool.is_null() {
            return Err(io::Error::other(format!(
                "burst-io: DPDK {name}: no mbuf pool of {} x {room} B (more memory: -m)",
                cfg.mbufs
            )));
        }
        for q in 0..queues {
            // SAFETY: a configured port, our pool, default queue configurations.
            let rc = unsafe {
                sys::rte_eth_rx_queue_setup(
                    port,
                    q,
                    cfg.descriptors,
                    sys::rte_socket_id(),
                    std::ptr::null(),
                    pool,
                )
            };
            if rc != 0 {
                return Err(errno(rc, "rx queue", &name));
            }
            // SAFETY: as above.
            let rc = unsafe {
                sys::rte_eth_tx_queue_setup(
                    port,
                    q,
                    cfg.descriptors,
                    sys::rte_socket_id(),
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(errno(rc, "tx queue", &name));
            }
        }
        // A memif client connects when it starts, once: wait (bounded) for
        // its server's socket file first.
        if let Some(path) = memif_client_socket(cfg) {
            let end = std::time::Instant::now() + LINK_WAIT;
            while !std::path::Path::new(&path).exists() && std::time::Instant::now() < end {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        // SAFETY: a fully set-up port.
        let rc = unsafe { sys::rte_eth_dev_start(port) };
        if rc != 0 {
            return Err(errno(rc, "start", &name));
        }
        // Only a memif client waits and may be restarted: restarting a
        // server would drop the socket a client is connecting to.
        let client = cfg
            .eal
            .iter()
            .any(|a| a.contains("net_memif") && a.contains("role=client"));
        // A server's link comes up when its client connects: it does not
        // wait (an application's server opens its device before it
        // listens for the client that will connect it).
        if client {
            wait_link_up(port, &name);
        }
        // SAFETY: plain call; some vdevs have no promiscuous mode.
        unsafe { sys::rte_eth_promiscuous_enable(port) };
        // SAFETY: as for info.
        let mut mac: sys::rte_ether_addr = unsafe { std::mem::zeroed() };
        // SAFETY: a started port and a live out-parameter.
        unsafe { sys::rte_eth_macaddr_get(port, &mut mac) };
        let owner = std::sync::Arc::new(PortOwner(port));
        Ok((0..queues)
            .map(|queue| DpdkLink {
                name: name.clone(),
                port,
                queue,
                _owner: std::sync::Arc::clone(&owner),
                pool,
                mac: mac.addr_bytes,
                room,
                scratch: vec![0u8; crate::MAX_PACKET],
                tx_dropped: 0,
            })
            .collect())
    }

    /// The device's port id.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// The device's statistics: (rx packets, tx packets, rx missed, rx errors).
    pub fn stats(&self) -> (u64, u64, u64, u64) {
        // SAFETY: zeroed stats are valid; the call fills them.
        let mut s: sys::rte_eth_stats = unsafe { std::mem::zeroed() };
        // SAFETY: our port and a live out-parameter.
        unsafe { sys::rte_eth_stats_get(self.port, &mut s) };
        (s.ipackets, s.opackets, s.imissed, s.ierrors)
    }
}

thread_local! {
    /// Whether this thread has an lcore id of its own.
    static REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives the calling thread an lcore id (once): engine and application
/// threads are not EAL threads, and without an lcore id every mbuf
/// allocation and free goes to the pool's shared ring instead of the
/// per-lcore cache.
fn register_thread() {
    REGISTERED.with(|r| {
        if !r.get() {
            // SAFETY: plain call after the EAL started; failure (no free
            // lcore) leaves the thread uncached but working.
            unsafe { sys::rte_thread_register() };
            r.set(true);
        }
    });
}

/// The socket file of a memif client vdev in `cfg` (not abstract), if any.
fn memif_client_socket(cfg: &DpdkConfig) -> Option<String> {
    let vdev = cfg
        .eal
        .iter()
        .find(|a| a.contains("net_memif") && a.contains("role=client"))?;
    if vdev.contains("socket-abstract=yes") || !vdev.contains("socket-abstract=no") {
        return None; // abstract sockets (memif's default) have no file
    }
    vdev.split(',')
        .find_map(|kv| kv.strip_prefix("socket="))
        .map(str::to_string)
}

/// How long [`DpdkLink::open`] waits for the link to come up.
const LINK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn link_up(port: u16) -> bool {
    // SAFETY: zeroed is valid; the call fills it for a started port.
    let mut l: sys::rte_eth_link = unsafe { std::mem::zeroed() };
    // SAFETY: our port and a live out-parameter.
    unsafe { sys::rte_eth_link_get_nowait(port, &mut l) };
    l.link_status() != 0
}

/// Waits (bounded) for a memif client's link: a client whose server was
/// not listening yet when the port started never connects by itself
/// (22.11 does not retry), so it is restarted every second. Frames sent
/// while the link is down are refused by the device and kept by burst.
fn wait_link_up(port: u16, name: &str) {
    let start = std::time::Instant::now();
    let mut restarted = start;
    while !link_up(port) {
        if start.elapsed() >= LINK_WAIT {
            tracing::warn!("burst-io: DPDK {name}: link still down after {LINK_WAIT:?}; going on");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        if restarted.elapsed() >= std::time::Duration::from_secs(1) {
            // SAFETY: stop and start of our configured port.
            unsafe {
                sys::rte_eth_dev_stop(port);
                sys::rte_eth_dev_start(port);
            }
            restarted = std::time::Instant::now();
        }
    }
}

/// The data of one mbuf segment.
///
/// # Safety
/// `m` must be a live mbuf whose data lies in its buffer.
unsafe fn seg_data<'a>(m: *const sys::rte_mbuf) -> &'a [u8] {
    // SAFETY: the caller's contract; data_off + data_len lie in the buffer.
    unsafe {
        let base = ((*m).buf_addr as *const u8).add(usize::from((*m).data_off));
        std::slice::from_raw_parts(base, usize::from((*m).data_len))
    }
}

impl FrameLink for DpdkLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_dropped(&self) -> u64 {
        // The device's counters are the port's: queue 0's lane reports them.
        if self.queue != 0 {
            return 0;
        }
        // SAFETY: zeroed stats are valid; the call fills them.
        let mut st: sys::rte_eth_stats = unsafe { std::mem::zeroed() };
        // SAFETY: our port and a live out-parameter.
        if unsafe { sys::rte_eth_stats_get(self.port, &mut st) } != 0 {
            return 0;
        }
        st.imissed + st.ierrors + st.rx_nombuf
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        register_thread();
        let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let want = max.min(BURST) as u16;
        // SAFETY: our started port's queue 0 and room for `want` pointers.
        let n = unsafe { sys::rte_eth_rx_burst(self.port, self.queue, pkts.as_mut_ptr(), want) };
        for &m in &pkts[..usize::from(n)] {
            // SAFETY: `m` is a live mbuf the device handed us; freed below.
            unsafe {
                if (*m).nb_segs <= 1 {
                    f(seg_data(m));
                } else {
                    // A chained frame: join its segments.
                    let mut len = 0;
                    let mut s = m;
                    while !s.is_null() {
                        let d = seg_data(s);
                        let end = (len + d.len()).min(self.scratch.len());
                        self.scratch[len..end].copy_from_slice(&d[..end - len]);
                        len = end;
                        s = (*s).next;
                    }
                    f(&self.scratch[..len]);
                }
                sys::rte_pktmbuf_free(m);
            }
        }
        Ok(usize::from(n))
    }

    fn send(
        &mut self,
        n: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> io::Result<usize> {
        register_thread();
        let mut done = 0;
        while done < n {
            let k = (n - done).min(BURST);
            let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
            // SAFETY: our pool and room for `k` pointers.
            if unsafe { sys::rte_pktmbuf_alloc_bulk(self.pool, pkts.as_mut_ptr(), k as u32) } != 0 {
                break; // pool empty: the caller retries the rest
            }
            let mut ready = 0;
            // Which of the `k` frames each ready mbuf carries.
            let mut orig = [0usize; BURST];
            for i in 0..k {
                let m = pkts[i];
                // SAFETY: a fresh mbuf: its data area is `buf_len - data_off`
                // writable bytes at `buf_addr + data_off`.
                let len = unsafe {
                    let cap = usize::from((*m).buf_len - (*m).data_off);
                    let base = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
                    let buf = std::slice::from_raw_parts_mut(base, cap);
                    let len = if cap >= crate::MAX_PACKET {
                        fill(done + i, buf)
                    } else {
                        // Frames may not fit one mbuf: build, then chain.
                        let len = fill(done + i, &mut self.scratch);
                        if len > 0 && !chain(self.pool, m, &self.scratch[..len]) {
                            0
                        } else {
                            len
                        }
                    };
                    if len > 0 && (*m).nb_segs <= 1 {
                        (*m).data_len = len as u16;
                        (*m).pkt_len = len as u32;
                    }
                    len
                };
                if len == 0 {
                    // SAFETY: an mbuf we own that goes nowhere.
                    unsafe { sys::rte_pktmbuf_free(m) };
                } else {
                    pkts[ready] = m;
                    orig[ready] = i;
                    ready += 1;
                }
            }
            // SAFETY: `ready` live, filled mbufs; the device takes ownership
            // of those it accepts.
            let took = usize::from(unsafe {
                sys::rte_eth_tx_burst(self.port, self.queue, pkts.as_mut_ptr(), ready as u16)
            });
            if took < ready {
                // SAFETY: the mbufs the device did not take are still ours.
                unsafe {
                    sys::rte_pktmbuf_free_bulk(pkts[took..].as_mut_ptr(), (ready - took) as u32)
                };
                // Report the frames before the first one not taken: the
                // caller keeps the rest, in order.
                return Ok(done + orig[took]);
            }
            done += k;
        }
        Ok(done)
    }

    fn readiness(&self) -> io::Result<Readiness> {
        Ok(Readiness::poll_mode())
    }

    fn lends(&self) -> bool {
        // Only mbufs that hold a whole packet after a header's headroom.
        self.room >= crate::MAX_PACKET
            && (sys::RTE_PKTMBUF_HEADROOM as usize) >= crate::FRAME_HEADROOM
    }

    unsafe fn lend(
        &mut self,
        n: usize,
        lent: &mut dyn FnMut(std::ptr::NonNull<u8>, usize, usize),
    ) -> usize {
        if !self.lends() {
            return 0;
        }
        register_thread();
        let mut given = 0;
        while given < n {
            let k = (n - given).min(BURST);
            let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
            // SAFETY: our pool and room for `k` pointers.
            if unsafe { sys::rte_pktmbuf_alloc_bulk(self.pool, pkts.as_mut_ptr(), k as u32) } != 0 {
                break; // pool empty: fewer lent, the rest copy
            }
            for &m in &pkts[..k] {
                // SAFETY: a fresh mbuf: `buf_len - data_off` bytes at
                // `buf_addr + data_off`, after `data_off` (the pool's
                // headroom, checked above) bytes of its own. Its memory is
                // the pool's, which lives until the process exits.
                let (ptr, cap) = unsafe {
                    let cap = usize::from((*m).buf_len - (*m).data_off);
                    let base = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
                    (std::ptr::NonNull::new_unchecked(base), cap)
                };
                lent(ptr, cap, m as usize);
            }
            given += k;
        }
        given
    }

    unsafe fn send_lent(&mut self, frames: &[(usize, usize, usize)]) -> io::Result<usize> {
        register_thread();
        let mut done = 0;
        while done < frames.len() {
            let k = (frames.len() - done).min(BURST);
            let mut pkts = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
            for (i, &(handle, headers, len)) in frames[done..done + k].iter().enumerate() {
                let m = handle as *mut sys::rte_mbuf;
                // SAFETY: the caller's contract: an mbuf `lend` gave, built
                // in place, its headers within the headroom.
                unsafe {
                    (*m).data_off -= headers as u16;
                    (*m).data_len = len as u16;
                    (*m).pkt_len = len as u32;
                }
                pkts[i] = m;
            }
            // SAFETY: `k` live, filled mbufs; the device takes ownership of
            // those it accepts.
            let took = usize::from(unsafe {
                sys::rte_eth_tx_burst(self.port, self.queue, pkts.as_mut_ptr(), k as u16)
            });
            if took < k {
                // The rest stay lent, as they were lent.
                for (i, &(_, headers, _)) in frames[done + took..done + k].iter().enumerate() {
                    // SAFETY: still ours (not taken).
                    unsafe { (*pkts[took + i]).data_off += headers as u16 };
                }
                return Ok(done + took);
            }
            done += k;
        }
        Ok(done)
    }

    unsafe fn reclaim(&mut self, handle: usize) {
        register_thread();
        // SAFETY: the caller's contract: an mbuf `lend` gave, given back once.
        unsafe { sys::rte_pktmbuf_free(handle as *mut sys::rte_mbuf) };
    }
}

/// Puts `frame` into `head` and as many mbufs chained after it as needed.
///
/// # Safety
/// `head` is a fresh mbuf of `pool`.
unsafe fn chain(pool: *mut sys::rte_mempool, head: *mut sys::rte_mbuf, frame: &[u8]) -> bool {
    // SAFETY: the caller's contract; every mbuf touched is fresh and ours.
    unsafe {
        let mut at = 0;
        let mut seg = head;
        loop {
            let cap = usize::from((*seg).buf_len - (*seg).data_off);
            let part = (frame.len() - at).min(cap);
            let base = ((*seg).buf_addr as *mut u8).add(usize::from((*seg).data_off));
            std::ptr::copy_nonoverlapping(frame[at..].as_ptr(), base, part);
            (*seg).data_len = part as u16;
            at += part;
            if seg != head {
                if sys::rte_pktmbuf_chain(head, seg) != 0 {
                    sys::rte_pktmbuf_free(seg);
                    return false;
                }
            }
            if at >= frame.len() {
                break;
            }
            let mut next = [std::ptr::null_mut::<sys::rte_mbuf>(); 1];
            if sys::rte_pktmbuf_alloc_bulk(pool, next.as_mut_ptr(), 1) != 0 {
                return false;
            }
            seg = next[0];
        }
        (*head).pkt_len = frame.len() as u32;
        true
    }
}

/// A started port; stopped and closed when the last of its links goes.
struct PortOwner(u16);

impl Drop for PortOwner {
    fn drop(&mut self) {
        // SAFETY: our port; stopping it returns its mbufs to the pool. The
        // pool itself stays (DPDK keeps memzones until the process ends;
        // a second open in the process creates a pool with another name).
        unsafe {
            sys::rte_eth_dev_stop(self.0);
            // Closing releases the vdev's resources (memif's socket file).
            sys::rte_eth_dev_close(self.0);
        }
    }
}

/// A DPDK [`RawPort`] for `ip`: burst owns the link (ARP of its own).
pub fn open_port(cfg: &DpdkConfig, ip: IpAddr) -> io::Result<RawPort<DpdkLink>> {
    let link = DpdkLink::open(cfg)?;
    Ok(RawPort::new(link, ip, Resolution::Own))
}

/// One DPDK [`RawPort`] per engine thread (lane), each on its own queue
/// pair of `cfg`'s port. Frames arrive on whichever queue the device (or
/// the peer's memif queue) chose; a lane hands RoCE frames for another
/// lane's QPs to that lane and shares what it learns of neighbours
/// ([`crate::raw::Lanes`]).
pub fn open_lane_ports(
    cfg: &DpdkConfig,
    ip: IpAddr,
    lanes: u16,
    first_qpn: u32,
) -> io::Result<Vec<RawPort<DpdkLink>>> {
    let links = DpdkLink::open_queues(cfg, lanes)?;
    let group = crate::raw::Lanes::group(links.len(), first_qpn);
    Ok(links
        .into_iter()
        .zip(group)
        .map(|(link, lane)| {
            let mut p = RawPort::new(link, ip, Resolution::Own);
            if lanes > 1 {
                p.set_lanes(lane);
            }
            p
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memif_devices_get_a_buffer_for_one_roce_frame_unless_given_one() {
        let c = DpdkConfig::parse(
            "--vdev=net_memif0,role=server --vdev=net_memif1,bsize=9216 --vdev=net_tap0 \
             --vdev net_memif2",
        );
        let args = c.eal_args();
        assert!(args.contains(&format!(
            "--vdev=net_memif0,role=server,bsize={MEMIF_BSIZE}"
        )));
        assert!(args.contains(&"--vdev=net_memif1,bsize=9216".to_string()));
        assert!(args.contains(&"--vdev=net_tap0".to_string()));
        assert!(args.contains(&format!("net_memif2,bsize={MEMIF_BSIZE}")));
    }
}
