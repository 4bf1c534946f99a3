//! An AF_XDP socket as a [`FrameLink`]: UMEM, fill/completion/rx/tx rings,
//! need-wakeup, copy or zero-copy mode, multi-buffer frames.
//!
//! The socket is driven with the kernel's UAPI (`linux/if_xdp.h`) directly
//! rather than through libxdp (xsk-rs): libxdp loads its own XDP program
//! and dispatcher, which fail on this kind of kernel (dataplane-notes:
//! "libxdp multi-prog dispatcher: no"), while burst loads its own steering
//! program ([`crate::xdp`]); and xsk-rs pins a libbpf-sys that conflicts
//! with libbpf-rs. The rings are a few atomics over shared memory.
//!
//! The UMEM is split in two: frames for receive live in the fill ring or
//! the kernel; frames for transmit sit in a free list, leave through the tx
//! ring and come back through the completion ring. A frame longer than one
//! chunk (RoCE MTU 4096 plus headers on a 4 KiB chunk) is carried in
//! several descriptors chained with `XDP_PKT_CONTD` (`XDP_USE_SG`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::raw::{FrameLink, RawPort, Resolution};
use crate::xdp::{XdpMode, XdpProgram};
use crate::Readiness;

/// How an AF_XDP link is set up.
#[derive(Debug, Clone)]
pub struct XskConfig {
    /// The interface.
    pub iface: String,
    /// Its receive queue the socket binds.
    pub queue: u32,
    /// Where the XDP program runs.
    pub mode: XdpMode,
    /// Ask for zero-copy (falls back to copy mode when the driver has none).
    pub zero_copy: bool,
    /// UMEM frames (half receive, half transmit).
    pub frames: u32,
    /// Ring sizes (a power of two).
    pub ring: u32,
}

impl XskConfig {
    /// Defaults for `iface`: queue 0, XDP where the driver runs it, copy or
    /// zero-copy as the driver offers, 8192 frames of 4 KiB, rings of 2048.
    pub fn new(iface: &str) -> XskConfig {
        XskConfig {
            iface: iface.into(),
            queue: 0,
            mode: XdpMode::Auto,
            zero_copy: true,
            frames: 8192,
            ring: 2048,
        }
    }
}

/// Size of a UMEM chunk: a page (the largest aligned chunk the kernel takes).
pub const CHUNK: usize = 4096;

/// One mapped ring: producer and consumer indices, flags, descriptors.
struct Ring {
    map: NonNull<u8>,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
    size: u32,
}

impl Ring {
    /// Maps ring `pgoff` of `fd` with the kernel's offsets.
    fn map(
        fd: &OwnedFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        desc_size: usize,
        pgoff: i64,
    ) -> io::Result<Ring> {
        let map_len = off.desc as usize + size as usize * desc_size;
        // SAFETY: mapping a region of the socket the kernel sized for this
        // ring; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the
        // mapping; the kernel aligns the indices for atomic access.
        unsafe {
            Ok(Ring {
                map: NonNull::new_unchecked(base),
                map_len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                desc: base.add(off.desc as usize),
                mask: size - 1,
                size,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Slots free to produce into (we are the producer).
    fn free(&self) -> u32 {
        let prod = self.producer().load(Ordering::Relaxed);
        let cons = self.consumer().load(Ordering::Acquire);
        self.size - prod.wrapping_sub(cons)
    }

    /// Entries ready to consume (we are the consumer).
    fn ready(&self) -> u32 {
        let cons = self.consumer().load(Ordering::Relaxed);
        let prod = self.producer().load(Ordering::Acquire);
        prod.wrapping_sub(cons)
    }

    fn addr_at(&self, i: u32) -> *mut u64 {
        // SAFETY: `i & mask` is inside the descriptor array of an address ring.
        unsafe { self.desc.cast::<u64>().add((i & self.mask) as usize) }
    }
    fn desc_at(&self, i: u32) -> *mut libc::xdp_desc {
        // SAFETY: `i & mask` is inside the descriptor array of an rx/tx ring.
        unsafe {
            self.desc
                .cast::<libc::xdp_desc>()
                .add((i & self.mask) as usize)
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

/// An AF_XDP socket with its UMEM and rings; with the XDP program that
/// feeds it (see the module documentation).
pub struct XskLink {
    name: String,
    mac: [u8; 6],
    ifindex: u32,
    fd: OwnedFd,
    umem: NonNull<u8>,
    umem_len: usize,
    fill: Ring,
    comp: Ring,
    rx: Ring,
    tx: Ring,
    /// Transmit frames not in the kernel.
    free_tx: Vec<u64>,
    /// Multi-buffer descriptors were negotiated.
    sg: bool,
    zero_copy: bool,
    mode: XdpMode,
    /// A frame being reassembled from several receive descriptors.
    partial: Vec<u8>,
    /// The receive queue the socket is bound to (its slot in the program).
    queue: u32,
    /// Shared by the lanes of one interface; detached with the last.
    program: Option<Arc<XdpProgram>>,
    /// The first lane's link reports the program's counters.
    reports_program: bool,
}

// SAFETY: the raw pointers point into mappings owned by this value; the
// rings are single-producer/single-consumer on our side and used only
// through `&mut self`, so moving the link to another thread is sound.
unsafe impl Send for XskLink {}

fn os_err(what: &str, iface: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(
        e.kind(),
        format!("burst-io: AF_XDP on {iface}: {what}: {e}"),
    )
}

fn set_opt<T>(fd: &OwnedFd, name: libc::c_int, v: &T, iface: &str, what: &str) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_err(what, iface));
    }
    Ok(())
}

/// The MAC address of `iface` (asked of the kernel: [`crate::netdev::mac`]).
pub fn interface_mac(iface: &str) -> io::Result<[u8; 6]> {
    crate::netdev::mac(iface).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("burst-io: interface {iface:?}: no such interface or no MAC"),
        )
    })
}

/// The index of `iface`, or an error naming it.
pub fn interface_index(iface: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(iface)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
    // SAFETY: a NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("burst-io: no interface named {iface:?}"),
        ));
    }
    Ok(i)
}

impl XskLink {
    /// Opens an AF_XDP socket on `cfg.iface` queue `cfg.queue`, loads and
    /// attaches burst's XDP program and steers RoCEv2 for `local` to it.
    pub fn open(cfg: &XskConfig, local: IpAddr) -> io::Result<XskLink> {
        Ok(XskLink::open_queues(cfg, local, 1)?.remove(0))
    }

    /// Opens `lanes` AF_XDP sockets on `cfg.iface`, bound to receive queues
    /// `cfg.queue` .. `cfg.queue + lanes` (one per engine thread), with one
    /// XDP program that sends each frame to the socket of the queue it
    /// arrived on. The interface needs that many queues (`ethtool -L IFACE
    /// combined N`; a veth's `numrxqueues`/`numtxqueues`); frames that
    /// arrive on a queue without a socket are dropped, so give the
    /// interface no more queues than lanes.
    pub fn open_queues(cfg: &XskConfig, local: IpAddr, lanes: u32) -> io::Result<Vec<XskLink>> {
        let iface = cfg.iface.as_str();
        let ifindex = interface_index(iface)?;
        let mac = interface_mac(iface)?;
        if lanes == 0 || cfg.queue.saturating_add(lanes) > crate::xdp::MAX_SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "burst-io: AF_XDP on {iface}: {lanes} lanes from queue {} (at most {} queues)",
                    cfg.queue,
                    crate::xdp::MAX_SLOTS
                ),
            ));
        }
        let mut links = Vec::with_capacity(lanes as usize);
        for q in cfg.queue..cfg.queue + lanes {
            let mut c = cfg.clone();
            c.queue = q;
            let link = XskLink::socket(&c, ifindex, mac).map_err(|e| {
                if lanes > 1 && e.raw_os_error() == Some(libc::EINVAL) {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "{e} ({lanes} engine threads need {lanes} queues on {iface}: \
                             `ethtool -L {iface} combined {lanes}`, or a veth made with \
                             numrxqueues/numtxqueues {lanes})"
                        ),
                    )
                } else {
                    e
                }
            })?;
            links.push(link);
        }
        let mut prog = XdpProgram::load()?;
        prog.add_local_addr(local)?;
        for l in &links {
            prog.set_socket(l.queue, &l.fd)?;
        }
        let mode = prog.attach(ifindex, cfg.mode).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{e} (interface {iface} does not take XDP; use the UDP port instead: BURST_PORT=udp)"),
            )
        })?;
        let prog = Arc::new(prog);
        for (i, l) in links.iter_mut().enumerate() {
            l.mode = mode;
            l.program = Some(Arc::clone(&prog));
            l.reports_program = i == 0;
        }
        Ok(links)
    }

    /// The receive queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    fn socket(cfg: &XskConfig, ifindex: u32, mac: [u8; 6]) -> io::Result<XskLink> {
        let iface = cfg.iface.as_str();
        if !cfg.ring.is_power_of_two() || cfg.frames < 2 * cfg.ring {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP: ring must be a power of two and frames at least twice the ring",
            ));
        }
        // SAFETY: plain socket(2); checked.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(os_err("socket (needs root or CAP_NET_RAW)", iface));
        }
        // SAFETY: a descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let umem_len = cfg.frames as usize * CHUNK;
        // SAFETY: an anonymous private mapping; checked.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(os_err("UMEM mmap", iface));
        }
        let umem = NonNull::new(umem.cast::<u8>()).expect("mmap succeeded");
        // From here the UMEM must be unmapped on error: a guard does it.
        struct Unmap(NonNull<u8>, usize);
        impl Drop for Unmap {
            fn drop(&mut self) {
                // SAFETY: unmapping the UMEM mapped above.
                unsafe { libc::munmap(self.0.as_ptr().cast(), self.1) };
            }
        }
        let guard = Unmap(umem, umem_len);
        // SAFETY: all-zero is a valid xdp_umem_reg.
        let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
        reg.addr = umem.as_ptr() as u64;
        reg.len = umem_len as u64;
        reg.chunk_size = CHUNK as u32;
        set_opt(&fd, libc::XDP_UMEM_REG, &reg, iface, "UMEM registration")?;
        let ring = cfg.ring;
        let fill_size = ring * 2;
        set_opt(
            &fd,
            libc::XDP_UMEM_FILL_RING,
            &fill_size,
            iface,
            "fill ring",
        )?;
        set_opt(
            &fd,
            libc::XDP_UMEM_COMPLETION_RING,
            &ring,
            iface,
            "completion ring",
        )?;
        set_opt(&fd, libc::XDP_RX_RING, &ring, iface, "rx ring")?;
        set_opt(&fd, libc::XDP_TX_RING, &ring, iface, "tx ring")?;
        // SAFETY: all-zero is valid; getsockopt fills it and its length.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` and `len` are live and describe each other.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(os_err("XDP_MMAP_OFFSETS", iface));
        }
        let addr = std::mem::size_of::<u64>();
        let desc = std::mem::size_of::<libc::xdp_desc>();
        let fill = Ring::map(
            &fd,
            &off.fr,
            fill_size,
            addr,
            libc::XDP_UMEM_PGOFF_FILL_RING as i64,
        )?;
        let comp = Ring::map(
            &fd,
            &off.cr,
            ring,
            addr,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as i64,
        )?;
        let rx = Ring::map(&fd, &off.rx, ring, desc, libc::XDP_PGOFF_RX_RING)?;
        let tx = Ring::map(&fd, &off.tx, ring, desc, libc::XDP_PGOFF_TX_RING)?;
        // Receive frames: the first half of the UMEM, all in the fill ring.
        let half = cfg.frames / 2;
        let give = half.min(fill_size);
        let prod = fill.producer().load(Ordering::Relaxed);
        for i in 0..give {
            // SAFETY: slot inside the fill ring's descriptor array.
            unsafe { fill.addr_at(prod + i).write((i as usize * CHUNK) as u64) };
        }
        fill.producer().store(prod + give, Ordering::Release);
        let free_tx = (half..cfg.frames)
            .map(|i| (i as usize * CHUNK) as u64)
            .collect();
        let mut link = XskLink {
            name: iface.into(),
            mac,
            ifindex,
            fd,
            umem,
            umem_len,
            fill,
            comp,
            rx,
            tx,
            free_tx,
            sg: false,
            zero_copy: false,
            mode: cfg.mode,
            partial: Vec::new(),
            queue: cfg.queue,
            program: None,
            reports_program: false,
        };
        std::mem::forget(guard); // the link unmaps it now
        link.bind(cfg)?;
        Ok(link)
    }

    /// Binds, trying zero-copy with multi-buffer first, then without each.
    fn bind(&mut self, cfg: &XskConfig) -> io::Result<()> {
        let mut tries = Vec::new();
        if cfg.zero_copy {
            tries.push((libc::XDP_ZEROCOPY | libc::XDP_USE_SG, true, true));
            tries.push((libc::XDP_ZEROCOPY, true, false));
        }
        tries.push((libc::XDP_COPY | libc::XDP_USE_SG, false, true));
        tries.push((libc::XDP_COPY, false, false));
        let mut last = None;
        // A queue whose previous socket closed a moment ago refuses a new
        // bind with EBUSY for about a second: try again, bounded.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            match self.try_bind(cfg, &tries, &mut last) {
                Ok(()) => return Ok(()),
                Err(busy) if busy && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(_) => return Err(last.expect("tried at least once")),
            }
        }
    }

    /// One round of bind attempts; `Err(true)` when the queue was busy.
    fn try_bind(
        &mut self,
        cfg: &XskConfig,
        tries: &[(u16, bool, bool)],
        last: &mut Option<io::Error>,
    ) -> Result<(), bool> {
        let base = libc::XDP_USE_NEED_WAKEUP;
        let mut busy = false;
        for &(flags, zc, sg) in tries {
            // SAFETY: all-zero is a valid sockaddr_xdp.
            let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
            sa.sxdp_family = libc::AF_XDP as u16;
            sa.sxdp_flags = base | flags;
            sa.sxdp_ifindex = self.ifindex;
            sa.sxdp_queue_id = cfg.queue;
            // SAFETY: a live sockaddr_xdp and its size.
            let rc = unsafe {
                libc::bind(
                    self.fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                self.zero_copy = zc;
                self.sg = sg;
                return Ok(());
            }
            busy |= io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
            *last = Some(os_err(&format!("bind to queue {}", cfg.queue), &self.name));
        }
        Err(busy)
    }

    /// Whether the socket runs in zero-copy mode.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Whether frames longer than a chunk can be carried (multi-buffer).
    pub fn multi_buffer(&self) -> bool {
        self.sg
    }

    /// Where the XDP program runs.
    pub fn xdp_mode(&self) -> XdpMode {
        self.mode
    }

    /// The steering program (to add QPN slots, read its counters).
    pub fn program(&self) -> Option<&XdpProgram> {
        self.program.as_deref()
    }

    fn frame(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let at = addr as usize;
        let len = len.min(self.umem_len.saturating_sub(at));
        // SAFETY: `at..at+len` lies inside the UMEM (clamped above); the
        // kernel does not write a frame while we own its descriptor.
        unsafe { std::slice::from_raw_parts_mut(self.umem.as_ptr().add(at), len) }
    }

    /// Writes the transmit descriptor of chunk `addr` (`len` bytes, more
    /// of the frame to come when `more`) at `prod + used`; counts it.
    ///
    /// # Safety
    /// The slot `prod + used` must be free (the caller checked the room).
    unsafe fn push_tx(&mut self, prod: u32, used: &mut u32, addr: u64, len: usize, more: bool) {
        let d = libc::xdp_desc {
            addr,
            len: len as u32,
            options: if more { libc::XDP_PKT_CONTD } else { 0 },
        };
        // SAFETY: the caller's contract: a free tx slot.
        unsafe { self.tx.desc_at(prod + *used).write(d) };
        *used += 1;
    }

    /// Hands the `used` descriptors written from `prod` on to the kernel.
    fn publish(&mut self, prod: u32, used: u32) {
        if used > 0 {
            self.tx.producer().store(prod + used, Ordering::Release);
        }
        // Copy mode sends at most 32 descriptors per wake-up: kick until the
        // kernel has taken what we produced (bounded), or once when it asks.
        if used > 0 || self.tx.ready() > 0 {
            for _ in 0..(used / 32 + 2) {
                if !self.tx.needs_wakeup() && self.zero_copy {
                    break;
                }
                self.kick();
                if self.tx.ready() == 0 {
                    break;
                }
            }
        }
    }

    /// Takes transmit frames back from the completion ring.
    fn reclaim(&mut self) {
        let n = self.comp.ready();
        if n == 0 {
            return;
        }
        let cons = self.comp.consumer().load(Ordering::Relaxed);
        for i in 0..n {
            // SAFETY: a slot the kernel produced.
            let a = unsafe { self.comp.addr_at(cons + i).read() };
            self.free_tx.push(a & !(CHUNK as u64 - 1));
        }
        self.comp.consumer().store(cons + n, Ordering::Release);
    }

    fn kick(&self) {
        // SAFETY: a zero-length sendto on our socket only wakes its tx path.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
    }
}

impl Drop for XskLink {
    fn drop(&mut self) {
        self.program = None; // detach before the socket goes
                             // SAFETY: unmapping the UMEM mapped in `socket`; the rings unmap
                             // themselves and the socket closes after this.
        unsafe { libc::munmap(self.umem.as_ptr().cast(), self.umem_len) };
    }
}

impl FrameLink for XskLink {
    fn name(&self) -> &str {
        &self.name
    }

    fn rx_dropped(&self) -> u64 {
        // Each lane's socket counts its own: frames with no fill-ring
        // buffer to land in (`rx_dropped`) and frames for a full receive
        // ring (`rx_ring_full`, kept apart when the whole struct is asked).
        // SAFETY: all-zero is valid; getsockopt fills it and its length.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `st` and `len` are live and describe each other.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut st as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return 0;
        }
        st.rx_dropped + st.rx_ring_full
    }

    fn flush_tx(&mut self) -> bool {
        if self.tx.ready() == 0 {
            return false;
        }
        self.kick();
        self.tx.ready() > 0
    }

    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn recv(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let n = self.rx.ready().min(self.fill.free()).min(max as u32 * 4);
        if n == 0 {
            if self.fill.needs_wakeup() {
                // SAFETY: a zero-length non-blocking recvfrom wakes the rx path.
                unsafe {
                    libc::recvfrom(
                        self.fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        0,
                        libc::MSG_DONTWAIT,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
            }
            return Ok(0);
        }
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        let fprod = self.fill.producer().load(Ordering::Relaxed);
        let mut frames = 0;
        // Descriptors taken: up to `n`, and no more frames than the caller
        // has room for (a frame of one descriptor each would otherwise
        // deliver four times `max`, and the caller dropped the rest).
        let mut used = 0;
        for i in 0..n {
            if frames == max && self.partial.is_empty() {
                break;
            }
            used = i + 1;
            // SAFETY: a descriptor the kernel produced.
            let d = unsafe { self.rx.desc_at(cons + i).read() };
            let contd = d.options & libc::XDP_PKT_CONTD != 0;
            let (addr, len) = (d.addr, d.len as usize);
            if contd || !self.partial.is_empty() {
                let at = (addr as usize).min(self.umem_len);
                let len = len.min(self.umem_len - at);
                // SAFETY: `at..at+len` lies inside the UMEM (clamped above)
                // and the kernel does not write this chunk while its
                // descriptor is ours (until it goes back to the fill ring).
                let part = unsafe { std::slice::from_raw_parts(self.umem.as_ptr().add(at), len) };
                self.partial.extend_from_slice(part);
                if !contd {
                    let whole = std::mem::take(&mut self.partial);
                    f(&whole);
                    self.partial = whole;
                    self.partial.clear();
                    frames += 1;
                }
            } else {
                let bytes: &[u8] = self.frame(addr, len);
                f(bytes);
                frames += 1;
            }
            // The chunk goes straight back to the fill ring.
            // SAFETY: a free fill slot (n <= fill.free()).
            unsafe {
                self.fill
                    .addr_at(fprod + i)
                    .write(addr & !(CHUNK as u64 - 1))
            };
        }
        self.rx.consumer().store(cons + used, Ordering::Release);
        self.fill.producer().store(fprod + used, Ordering::Release);
        Ok(frames)
    }

    fn send(
        &mut self,
        n: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> io::Result<usize> {
        self.reclaim();
        let prod = self.tx.producer().load(Ordering::Relaxed);
        let mut used = 0u32;
        let mut scratch = [0u8; crate::MAX_PACKET];
        let mut sent = 0;
        for i in 0..n {
            // Room for the largest frame this link carries in chunks.
            let most = if self.sg {
                scratch.len().div_ceil(CHUNK)
            } else {
                1
            };
            if self.free_tx.len() < most || (self.tx.free() - used) < most as u32 {
                break;
            }
            let len = if self.sg {
                let len = fill(i, &mut scratch);
                let mut at = 0;
                while at < len {
                    let part = (len - at).min(CHUNK);
                    let a = self.free_tx.pop().expect("room checked");
                    self.frame(a, part).copy_from_slice(&scratch[at..at + part]);
                    at += part;
                    // SAFETY: room checked for the frame's chunks.
                    unsafe { self.push_tx(prod, &mut used, a, part, at < len) };
                }
                len
            } else {
                let a = self.free_tx.pop().expect("room checked");
                let len = fill(i, self.frame(a, CHUNK));
                if len == 0 {
                    self.free_tx.push(a);
                } else {
                    // SAFETY: a free tx slot (room checked).
                    unsafe { self.push_tx(prod, &mut used, a, len, false) };
                }
                len
            };
            let _ = len;
            sent += 1;
        }
        self.publish(prod, used);
        Ok(sent)
    }

    fn send_parts<'a>(
        &mut self,
        n: usize,
        parts: &mut crate::raw::FrameParts<'a, '_>,
    ) -> io::Result<usize> {
        self.reclaim();
        let prod = self.tx.producer().load(Ordering::Relaxed);
        let mut used = 0u32;
        let mut sent = 0;
        let mut head = [0u8; crate::FRAME_HEADROOM];
        // Room for the largest frame this link carries in chunks.
        let most = if self.sg {
            (crate::FRAME_HEADROOM + crate::MAX_PACKET).div_ceil(CHUNK)
        } else {
            1
        };
        for i in 0..n {
            if self.free_tx.len() < most || (self.tx.free() - used) < most as u32 {
                break;
            }
            sent += 1;
            let (h, ib) = parts(i, &mut head);
            let len = h + ib.len();
            if h == 0 || len > most * CHUNK {
                continue; // skipped (counted by the caller)
            }
            // Headers, then the transport bytes, straight into the chunks.
            let mut at = 0;
            while at < len {
                let part = (len - at).min(CHUNK);
                let a = self.free_tx.pop().expect("room checked");
                let dst = self.frame(a, part);
                let from_head = h.saturating_sub(at).min(part);
                if from_head > 0 {
                    dst[..from_head].copy_from_slice(&head[at..at + from_head]);
                }
                let ib_at = (at + from_head) - h;
                dst[from_head..].copy_from_slice(&ib[ib_at..ib_at + part - from_head]);
                at += part;
                // SAFETY: room checked for the frame's chunks.
                unsafe { self.push_tx(prod, &mut used, a, part, at < len) };
            }
        }
        self.publish(prod, used);
        Ok(sent)
    }

    fn readiness(&self) -> io::Result<Readiness> {
        Ok(Readiness::from_fd(self.fd.try_clone()?))
    }

    fn steer_qp(&mut self, qpn: u32, lane: u32) {
        if let Some(p) = &self.program {
            if let Err(e) = p.set_qpn_slot(qpn, lane) {
                tracing::warn!("burst-io: steering QP {qpn:#x} on {}: {e}", self.name);
            }
        }
    }

    fn unsteer_qp(&mut self, qpn: u32) {
        if let Some(p) = &self.program {
            p.clear_qpn(qpn);
        }
    }

    fn steered_unknown_qpn(&self) -> u64 {
        // The program's counters are the interface's: reported by the
        // first lane only, so that a device's sum over lanes is right.
        match &self.program {
            Some(p) if self.reports_program => p.stats().unknown_qpn,
            _ => 0,
        }
    }
}

/// An AF_XDP [`RawPort`] for `ip` on `cfg.iface`: the kernel keeps the
/// interface (and answers ARP); burst takes its RoCEv2 frames.
pub fn open_port(cfg: &XskConfig, ip: IpAddr) -> io::Result<RawPort<XskLink>> {
    let link = XskLink::open(cfg, ip)?;
    let ifindex = link.ifindex;
    Ok(RawPort::new(link, ip, Resolution::Kernel { ifindex }))
}

/// One AF_XDP [`RawPort`] per engine thread (lane), each with the socket
/// of one receive queue of `cfg.iface` ([`XskLink::open_queues`]). A frame
/// lands on the queue the peer's flow hashed to; the lane that receives a
/// frame for another lane's QP hands it over ([`crate::raw::Lanes`]).
pub fn open_lane_ports(
    cfg: &XskConfig,
    ip: IpAddr,
    lanes: u32,
    first_qpn: u32,
) -> io::Result<Vec<RawPort<XskLink>>> {
    let links = XskLink::open_queues(cfg, ip, lanes)?;
    let group = crate::raw::Lanes::group(links.len(), first_qpn);
    Ok(links
        .into_iter()
        .zip(group)
        .map(|(link, lane)| {
            let ifindex = link.ifindex;
            let mut p = RawPort::new(link, ip, Resolution::Kernel { ifindex });
            if lanes > 1 {
                p.set_lanes(lane);
            }
            p
        })
        .collect())
}
