//! burst's XDP steering program (`ebpf/xdp_roce.bpf.c`), loaded with
//! libbpf-rs: which frames go to burst's AF_XDP sockets, and to which.
//!
//! The program sends RoCEv2 (UDP port 4791) to one of the device's
//! addresses ([`XdpProgram::add_local_addr`]) to the socket in the slot of
//! the receive queue it arrived on ([`XdpProgram::set_socket`]: slot `q`
//! holds the socket bound to queue `q`; the kernel delivers a redirected
//! frame to no other) and passes everything else to the kernel. Which lane
//! owns a QPN ([`XdpProgram::set_qpn_slot`]) is counted against the queue
//! a frame came on: a frame on another lane's queue is handed over in user
//! space ([`crate::raw::Lanes`]).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, XdpFlags};

/// The compiled program (clang, at build time).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_roce.bpf.o"));

/// Most sockets (engine threads) the program steers to.
pub const MAX_SLOTS: u32 = 64;

/// The program's counters (keep in step with `enum stat` in the C source).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Frames handed to the kernel.
    pub passed: u64,
    /// RoCEv2 frames to a local address, redirected to a socket slot.
    pub steered: u64,
    /// ... of which the QPN was owned by no lane.
    pub unknown_qpn: u64,
    /// ... of which the frame was too short to hold a BTH.
    pub truncated: u64,
    /// ... of which the QPN's lane was not the one of the arrival queue
    /// (handed over between lanes in user space).
    pub other_lane: u64,
}

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// In the driver where it can run (native), else generic.
    #[default]
    Auto,
    /// In the driver (native XDP).
    Native,
    /// In the kernel's generic (SKB) path: works on any interface, slower.
    Generic,
}

/// The loaded program and its maps; detached from its interface on drop.
pub struct XdpProgram {
    obj: Object,
    prog_fd: OwnedFd,
    xsks: MapHandle,
    qpn_slots: MapHandle,
    local_addrs: MapHandle,
    stats: MapHandle,
    slot_hits: MapHandle,
    attached: Option<(i32, XdpFlags)>,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "XdpProgram(attached: {:?})",
            self.attached.as_ref().map(|a| a.0)
        )
    }
}

fn bpf_err(what: &str, e: libbpf_rs::Error) -> io::Error {
    let kind = match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => io::ErrorKind::PermissionDenied,
        libbpf_rs::ErrorKind::NotFound => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("burst-io: {what}: {e:#}"))
}

/// A map's key for an address: the RoCE GID (IPv4-mapped for IPv4).
fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

impl XdpProgram {
    /// Loads the program into the kernel (needs CAP_BPF or root), not yet
    /// attached to any interface.
    pub fn load() -> io::Result<XdpProgram> {
        let open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| bpf_err("opening the XDP program", e))?;
        let obj = open
            .load()
            .map_err(|e| bpf_err("loading the XDP program (needs root or CAP_BPF)", e))?;
        let map = |name: &str| -> io::Result<MapHandle> {
            let m = obj
                .maps()
                .find(|m| m.name() == name)
                .ok_or_else(|| io::Error::other(format!("XDP program has no map {name}")))?;
            MapHandle::try_from(&m).map_err(|e| bpf_err("map handle", e))
        };
        let xsks = map("xsks")?;
        let qpn_slots = map("qpn_slots")?;
        let local_addrs = map("local_addrs")?;
        let stats = map("stats")?;
        let slot_hits = map("slot_hits")?;
        let prog_fd = obj
            .progs()
            .find(|p| p.name() == "burst_xdp")
            .ok_or_else(|| io::Error::other("XDP program burst_xdp missing"))?
            .as_fd()
            .try_clone_to_owned()?;
        Ok(XdpProgram {
            obj,
            prog_fd,
            xsks,
            qpn_slots,
            local_addrs,
            stats,
            slot_hits,
            attached: None,
        })
    }

    /// Attaches the program to interface `ifindex` (replacing a program a
    /// killed process may have left there).
    pub fn attach(&mut self, ifindex: u32, mode: XdpMode) -> io::Result<XdpMode> {
        let xdp = libbpf_rs::Xdp::new(self.prog_fd.as_fd());
        let try_mode = |m: XdpMode| {
            let flags = match m {
                XdpMode::Native => XdpFlags::DRV_MODE,
                _ => XdpFlags::SKB_MODE,
            };
            xdp.attach(ifindex as i32, flags).map(|()| m)
        };
        let got = match mode {
            XdpMode::Auto => match try_mode(XdpMode::Native) {
                Ok(m) => m,
                Err(_) => try_mode(XdpMode::Generic).map_err(|e| bpf_err("attaching XDP", e))?,
            },
            m => try_mode(m).map_err(|e| bpf_err("attaching XDP", e))?,
        };
        let flags = match got {
            XdpMode::Native => XdpFlags::DRV_MODE,
            _ => XdpFlags::SKB_MODE,
        };
        self.attached = Some((ifindex as i32, flags));
        Ok(got)
    }

    /// Steers RoCEv2 to `ip` (an address of the device) to burst.
    pub fn add_local_addr(&self, ip: IpAddr) -> io::Result<()> {
        self.local_addrs
            .update(&gid(ip), &1u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| bpf_err("local address map", e))
    }

    /// Records that lane (slot) `slot` owns `qpn` (frames for it that
    /// arrive on another queue are counted as [`XdpStats::other_lane`]).
    pub fn set_qpn_slot(&self, qpn: u32, slot: u32) -> io::Result<()> {
        self.qpn_slots
            .update(&qpn.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| bpf_err("QPN map", e))
    }

    /// Forgets `qpn` (its frames count as [`XdpStats::unknown_qpn`]).
    pub fn clear_qpn(&self, qpn: u32) {
        let _ = self.qpn_slots.delete(&qpn.to_ne_bytes());
    }

    /// Puts AF_XDP socket `fd`, bound to receive queue `slot`, in `slot`.
    pub fn set_socket(&self, slot: u32, fd: &impl AsRawFd) -> io::Result<()> {
        let fd = fd.as_raw_fd() as u32;
        self.xsks
            .update(&slot.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| bpf_err("XSK map", e))
    }

    fn sum_percpu(map: &MapHandle, key: u32) -> u64 {
        map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)
            .ok()
            .flatten()
            .map_or(0, |per_cpu| {
                per_cpu
                    .iter()
                    .filter_map(|v| {
                        v.get(..8)
                            .map(|b| u64::from_ne_bytes(b.try_into().expect("8")))
                    })
                    .sum()
            })
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> XdpStats {
        let s = |k| Self::sum_percpu(&self.stats, k);
        XdpStats {
            passed: s(0),
            steered: s(1),
            unknown_qpn: s(2),
            truncated: s(3),
            other_lane: s(4),
        }
    }

    /// Frames steered to `slot` (arrived on queue `slot`), summed over CPUs.
    pub fn slot_hits(&self, slot: u32) -> u64 {
        Self::sum_percpu(&self.slot_hits, slot)
    }

    /// Runs the program once on `frame` in the kernel (`BPF_PROG_TEST_RUN`)
    /// and returns its verdict (`XDP_DROP` 1, `XDP_PASS` 2, `XDP_REDIRECT`
    /// 4). A redirect to an empty socket slot falls back to `XDP_DROP`.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        let prog = self
            .obj
            .progs_mut()
            .find(|p| p.name() == "burst_xdp")
            .ok_or_else(|| io::Error::other("XDP program burst_xdp missing"))?;
        let input = libbpf_rs::ProgramInput {
            data_in: Some(frame),
            ..Default::default()
        };
        let out = prog
            .test_run(input)
            .map_err(|e| bpf_err("BPF_PROG_TEST_RUN", e))?;
        Ok(out.return_value)
    }
}

impl Drop for XdpProgram {
    fn drop(&mut self) {
        if let Some((ifindex, flags)) = self.attached.take() {
            let xdp = libbpf_rs::Xdp::new(self.prog_fd.as_fd());
            let _ = xdp.detach(ifindex, flags);
        }
    }
}
