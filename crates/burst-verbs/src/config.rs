//! Which devices burst opens: from the environment and a config file.
//!
//! A burst device is one IP address of this host (its GID) with a UDP port
//! bound to 4791 on it. Devices are named `burst0`, `burst1`, … unless the
//! config file names them.
//!
//! | variable | meaning |
//! |---|---|
//! | `BURST_ADDR` | comma-separated addresses, one device each |
//! | `BURST_IFACE` | comma-separated interfaces, one device each (first IPv4 address, else a global IPv6 one) |
//! | `BURST_MTU` | active MTU override: 256, 512, 1024, 2048 or 4096 |
//! | `BURST_LOG` | log filter (`error`, `warn`, `info`, `debug`, `trace`) |
//! | `BURST_CONFIG` | config file (default `$XDG_CONFIG_HOME/burst/burst.toml`, then `/etc/burst/burst.toml`) |
//! | `BURST_TEST_DROP` | drop one sent packet in N at random (loss tests) |
//! | `BURST_CC` | congestion control: `loss-window` (default), `dcqcn`, `dcqcn+loss-window`, `none` |
//! | `BURST_PORT` | packet port: `udp` (default: a kernel UDP socket), `af-xdp` (AF_XDP socket and XDP program on the device's interface; built with feature `af-xdp`, needs root), `af-xdp-generic` (the same in the kernel's generic XDP path), `dpdk` (a DPDK port burst owns; feature `dpdk`; the address need not be the host's) |
//! | `BURST_THREADS` | engine threads per device (default 1): each owns its own port queue and the QPs placed on it (UDP and DPDK ports) |
//! | `BURST_ENGINE_CPUS` | comma-separated CPUs the engine threads are pinned to, lane k on the k-th (wrapping); unset, not pinned |
//! | `BURST_BUSY_POLL` | `1`: each engine thread owns its core and spins (it never waits in the kernel, and application threads never step its lane: posts go through the doorbell rings, polls read the CQ rings); for hosts with a core to spare per lane, pinned with `BURST_ENGINE_CPUS` |
//! | `BURST_DAEMON` | burstd's control socket (e.g. `/run/burst/burstd.sock`): daemon mode, the device is burstd's; unset, the application embeds its own engine |
//! | `BURST_MR` | daemon mode: `copy` makes burstd reach registered memory through the application's `/proc/self/mem` descriptor instead of remapping it onto a shared memfd |
//! | `BURST_COPY` | what moves payload: `cpu` (default: the CPU, the payload's CRC taken while it is gathered), `cpu-plain` (memcpy, then a separate ICRC pass), `dsa` (an Intel DSA work queue found under `/dev/dsa`), `dsa-model` (burst-dsa's software model of a DSA on a thread of its own: the offload path without the hardware), `dmadev` (a DPDK DMA device named in `BURST_DPDK`'s `dma=NAME`; feature `dpdk`) |
//! | `BURST_COPY_MIN` | with an offload backend, copies smaller than this many bytes stay on the CPU (default 4096) |
//! | `BURST_DSA_MODEL_FAULT_EVERY` | with `dsa-model`: every n-th descriptor faults halfway and the CPU finishes it (tests of the fault path) |
//! | `BURST_DPDK` | the DPDK port: EAL arguments (`--vdev=net_memif0,role=server,socket=/tmp/m.sock`, ...) and `device=NAME`, `mbuf=BYTES` |
//!
//! The file, in TOML; variables override it:
//!
//! ```toml
//! log = "info"
//! # daemon = "/run/burst/burstd.sock"   # use burstd instead of an embedded engine
//! [[device]]
//! name = "burst0"
//! address = "198.18.0.1"     # or: interface = "veth0"
//! mtu = 4096                 # optional; default from the interface MTU
//! congestion_control = "dcqcn"  # optional; default "loss-window"
//! port = "af-xdp"            # optional; default "udp"
//! threads = 2                # optional engine threads; default 1
//! engine_cpus = [2, 3]       # optional: pin lane k's engine thread to the k-th CPU
//! busy_poll = false          # optional: engine threads spin on cores of their own
//! copy = "cpu"               # optional copy backend (BURST_COPY); default "cpu"
//! copy_min = 4096            # optional: smallest copy an offload backend takes
//! dpdk = "--vdev=net_memif0,role=client device=net_memif0"  # with port = "dpdk"
//! ```
//!
//! ```
//! use burst_verbs::config::Config;
//! let env = |k: &str| (k == "BURST_ADDR").then(|| "127.0.0.1".to_string());
//! let c = Config::from_sources(env, None).unwrap();
//! assert_eq!(c.devices[0].name, "burst0");
//! assert_eq!(c.devices[0].interface.as_deref(), Some("lo"));
//! ```

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use burst_wire::Mtu;
use serde::Deserialize;

use crate::{active_mtu_for, netif};

/// Congestion control of a device ([`DeviceConfig::congestion_control`]).
pub use burst_cc::{Algorithm, DcqcnConfig};

/// Why no device could be configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither variables nor a file name a device.
    #[error(
        "burst: no device configured: set BURST_ADDR=<ip> or BURST_IFACE=<interface>, \
         or write a config file (BURST_CONFIG, default $XDG_CONFIG_HOME/burst/burst.toml)"
    )]
    NotConfigured,
    /// The address is not one of this host's.
    #[error("burst: address {0} is not on this host (not on any interface)")]
    AddrNotOnHost(IpAddr),
    /// No such interface, or it has no usable address.
    #[error("burst: interface {0:?}: {1}")]
    Interface(String, String),
    /// A value could not be parsed.
    #[error("burst: bad value for {key}: {value:?} ({why})")]
    BadValue {
        /// Variable or key.
        key: String,
        /// What was given.
        value: String,
        /// What is expected.
        why: &'static str,
    },
    /// The config file could not be read or parsed.
    #[error("burst: config file {path}: {msg}")]
    File {
        /// Its path.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
}

/// One device to open.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    /// Device name (`burst0`).
    pub name: String,
    /// The address its port binds (its GID is derived from it).
    pub addr: IpAddr,
    /// The interface holding the address, when known.
    pub interface: Option<String>,
    /// Active MTU.
    pub mtu: Mtu,
    /// Drop one sent packet in N at random (0 = never): loss tests.
    pub drop_every: u64,
    /// Congestion control.
    pub congestion_control: burst_cc::Algorithm,
    /// The packet port.
    pub port: PortKind,
    /// The DPDK port's EAL arguments and keys (see `BURST_DPDK`), with
    /// [`PortKind::Dpdk`].
    pub dpdk: String,
    /// Engine threads (lanes), each with its own port queue and QPs.
    pub threads: u32,
    /// What moves payload between packets and memory.
    pub copy: CopyConfig,
    /// Where the engine threads run, and whether they sleep.
    pub engine: EngineConfig,
}

/// Where a device's engine threads run, and whether they sleep
/// (`BURST_ENGINE_CPUS`, `BURST_BUSY_POLL`).
///
/// ```
/// use burst_verbs::config::Config;
/// let env = |k: &str| match k {
///     "BURST_ADDR" => Some("127.0.0.1".to_string()),
///     "BURST_ENGINE_CPUS" => Some("0".to_string()),
///     "BURST_BUSY_POLL" => Some("1".to_string()),
///     _ => None,
/// };
/// let cfg = Config::from_sources(env, None).unwrap();
/// assert_eq!(cfg.devices[0].engine.cpus, [0]);
/// assert!(cfg.devices[0].engine.busy_poll);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineConfig {
    /// CPUs the engine threads are pinned to: lane k on `cpus[k % len]`
    /// (empty: not pinned). Each must be one this process may run on.
    pub cpus: Vec<usize>,
    /// Each engine thread owns its core and spins: it never waits in the
    /// kernel, and application threads never step its lane (posts go
    /// through the doorbell rings, polls read the CQ rings), so an
    /// application thread that spins on memory for a peer's WRITE, or
    /// computes, never leaves packets waiting. Costs a core per lane,
    /// busy or idle.
    pub busy_poll: bool,
}

/// Which engine moves payload ([`burst_mem::Copier`]; `BURST_COPY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyBackend {
    /// The CPU, the payload's CRC-32 computed in the same pass as its
    /// gather (the ICRC then reads only the headers).
    #[default]
    Cpu,
    /// The CPU: `memcpy`, then the ICRC over the whole packet.
    CpuPlain,
    /// An Intel DSA work queue (`/dev/dsa`, found by discovery).
    Dsa,
    /// burst-dsa's software model of a DSA, on a thread of its own: the
    /// offload path (descriptors, batches, completion records, page faults
    /// finished on the CPU) where there is no DSA.
    DsaModel,
    /// A DPDK DMA device (feature `dpdk`; `dma=NAME` in `BURST_DPDK`).
    Dmadev,
}

impl CopyBackend {
    /// Every backend, in the order [`CopyBackend::name`] lists them.
    pub const ALL: [CopyBackend; 5] = [
        CopyBackend::Cpu,
        CopyBackend::CpuPlain,
        CopyBackend::Dsa,
        CopyBackend::DsaModel,
        CopyBackend::Dmadev,
    ];

    /// Parses `cpu`, `cpu-plain`, `dsa`, `dsa-model`, `dmadev`.
    pub fn from_name(s: &str) -> Option<CopyBackend> {
        Self::ALL.into_iter().find(|b| b.name() == s.trim())
    }

    /// The name [`CopyBackend::from_name`] reads.
    pub fn name(&self) -> &'static str {
        match self {
            CopyBackend::Cpu => "cpu",
            CopyBackend::CpuPlain => "cpu-plain",
            CopyBackend::Dsa => "dsa",
            CopyBackend::DsaModel => "dsa-model",
            CopyBackend::Dmadev => "dmadev",
        }
    }
}

/// The copy engine of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyConfig {
    /// Which backend.
    pub backend: CopyBackend,
    /// With an offload backend, copies smaller than this stay on the CPU
    /// (a descriptor's round trip costs more than copying them).
    pub min_offload: u64,
    /// Test support, `dsa-model` only: every n-th MEMMOVE of the model
    /// faults halfway (the rest is finished on the CPU); 0 never
    /// (`BURST_DSA_MODEL_FAULT_EVERY`).
    pub model_fault_every: u64,
}

impl CopyConfig {
    /// `base` with what `BURST_COPY`, `BURST_COPY_MIN` and
    /// `BURST_DSA_MODEL_FAULT_EVERY` in `env` change.
    ///
    /// ```
    /// use burst_verbs::config::{CopyBackend, CopyConfig};
    /// let env = |k: &str| match k {
    ///     "BURST_COPY" => Some("dsa-model".to_string()),
    ///     "BURST_COPY_MIN" => Some("0".to_string()),
    ///     _ => None,
    /// };
    /// let c = CopyConfig::from_vars(env, CopyConfig::default()).unwrap();
    /// assert_eq!((c.backend, c.min_offload), (CopyBackend::DsaModel, 0));
    /// ```
    pub fn from_vars(
        env: impl Fn(&str) -> Option<String>,
        base: CopyConfig,
    ) -> Result<CopyConfig, ConfigError> {
        let mut c = base;
        let set = |k: &str| env(k).filter(|s| !s.trim().is_empty());
        if let Some(b) = set("BURST_COPY") {
            c.backend = parse_copy("BURST_COPY", &b)?;
        }
        if let Some(m) = set("BURST_COPY_MIN") {
            c.min_offload = parse_bytes("BURST_COPY_MIN", &m)?;
        }
        if let Some(n) = set("BURST_DSA_MODEL_FAULT_EVERY") {
            c.model_fault_every = parse_bytes("BURST_DSA_MODEL_FAULT_EVERY", &n)?;
        }
        Ok(c)
    }
}

/// Copies below this many bytes stay on the CPU with an offload backend:
/// dma_skeleton's 4 KiB job took 310 ns against memcpy's 52 (Session 14),
/// and a DSA's round trip is of the order of a microsecond.
pub const DEFAULT_MIN_OFFLOAD: u64 = 4096;

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig {
            backend: CopyBackend::default(),
            min_offload: DEFAULT_MIN_OFFLOAD,
            model_fault_every: 0,
        }
    }
}

fn parse_copy(key: &str, v: &str) -> Result<CopyBackend, ConfigError> {
    CopyBackend::from_name(v).ok_or(ConfigError::BadValue {
        key: key.into(),
        value: v.into(),
        why: "one of cpu, cpu-plain, dsa, dsa-model, dmadev",
    })
}

fn parse_bytes(key: &str, v: &str) -> Result<u64, ConfigError> {
    parse_number(key, v, "a whole number")
}

/// Which packet port a device runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PortKind {
    /// A kernel UDP socket on port 4791 (no privilege, no setup).
    #[default]
    Udp,
    /// An AF_XDP socket on the device's interface, fed by burst's XDP
    /// program; `generic` runs the program in the kernel's generic path.
    AfXdp {
        /// Generic (SKB) XDP rather than native where the driver has it.
        generic: bool,
    },
    /// A DPDK ethdev (a vdev: memif, af_packet, af_xdp, tap, or a NIC)
    /// that burst owns, answering ARP itself.
    Dpdk,
}

impl PortKind {
    /// Parses `udp`, `af-xdp`, `af-xdp-generic`.
    pub fn from_name(s: &str) -> Option<PortKind> {
        match s.trim() {
            "udp" => Some(PortKind::Udp),
            "af-xdp" | "af_xdp" | "xdp" => Some(PortKind::AfXdp { generic: false }),
            "af-xdp-generic" => Some(PortKind::AfXdp { generic: true }),
            "dpdk" => Some(PortKind::Dpdk),
            _ => None,
        }
    }

    /// The name [`PortKind::from_name`] reads.
    pub fn name(&self) -> &'static str {
        match self {
            PortKind::Udp => "udp",
            PortKind::AfXdp { generic: false } => "af-xdp",
            PortKind::AfXdp { generic: true } => "af-xdp-generic",
            PortKind::Dpdk => "dpdk",
        }
    }
}

fn parse_threads(key: &str, v: &str) -> Result<u32, ConfigError> {
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or(ConfigError::BadValue {
            key: key.into(),
            value: v.into(),
            why: "engine threads, 1 to 64",
        })
}

/// CPU numbers for the engine threads: each one this process may run on.
fn check_cpus(key: &str, cpus: Vec<usize>) -> Result<Vec<usize>, ConfigError> {
    let allowed = crate::thread::allowed_cpus();
    match cpus.iter().find(|c| !allowed.contains(c)) {
        Some(c) => Err(ConfigError::BadValue {
            key: key.into(),
            value: c.to_string(),
            why: "a CPU this process may run on (see its affinity, `taskset -p`)",
        }),
        None => Ok(cpus),
    }
}

fn parse_port(key: &str, v: &str) -> Result<PortKind, ConfigError> {
    PortKind::from_name(v).ok_or(ConfigError::BadValue {
        key: key.into(),
        value: v.into(),
        why: "one of udp, af-xdp, af-xdp-generic, dpdk",
    })
}

/// Everything configured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// Devices, in order.
    pub devices: Vec<DeviceConfig>,
    /// Log filter, if set.
    pub log: Option<String>,
    /// burstd's socket: when set, applications use the daemon's device
    /// (daemon mode) instead of opening their own.
    pub daemon: Option<PathBuf>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    log: Option<String>,
    daemon: Option<PathBuf>,
    /// burstd's own settings (its socket and permissions): read by burstd.
    #[allow(dead_code)]
    burstd: Option<toml::Table>,
    #[serde(default)]
    device: Vec<FileDevice>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDevice {
    name: Option<String>,
    address: Option<String>,
    interface: Option<String>,
    mtu: Option<u32>,
    congestion_control: Option<String>,
    port: Option<String>,
    dpdk: Option<String>,
    /// Engine threads per device.
    threads: Option<u32>,
    /// Copy backend (`BURST_COPY`'s names).
    copy: Option<String>,
    /// Smallest copy an offload backend takes.
    copy_min: Option<u64>,
    /// CPUs to pin the engine threads to.
    engine_cpus: Option<Vec<usize>>,
    /// Engine threads that spin on cores of their own.
    busy_poll: Option<bool>,
}

fn parse_cc(key: &str, v: &str) -> Result<burst_cc::Algorithm, ConfigError> {
    burst_cc::Algorithm::from_name(v).ok_or(ConfigError::BadValue {
        key: key.into(),
        value: v.into(),
        why: "one of loss-window, dcqcn, dcqcn+loss-window, none",
    })
}

fn parse_mtu(key: &str, v: u32) -> Result<Mtu, ConfigError> {
    Mtu::ALL
        .into_iter()
        .find(|m| m.bytes() as u32 == v)
        .ok_or(ConfigError::BadValue {
            key: key.into(),
            value: v.to_string(),
            why: "one of 256, 512, 1024, 2048, 4096",
        })
}

impl DeviceConfig {
    /// A device on `addr`, which must be an address of this host (any
    /// 127/8 address counts, as Linux accepts them on `lo`).
    pub fn for_addr(name: &str, addr: IpAddr) -> Result<DeviceConfig, ConfigError> {
        let iface = if addr.is_loopback() {
            Some("lo".to_string())
        } else {
            let all = netif::addresses()
                .map_err(|e| ConfigError::Interface("*".into(), e.to_string()))?;
            Some(
                all.into_iter()
                    .find(|a| a.ip == addr)
                    .ok_or(ConfigError::AddrNotOnHost(addr))?
                    .name,
            )
        };
        let mtu = iface
            .as_deref()
            .and_then(|i| netif::mtu(i).ok())
            .map_or(Mtu::Mtu1024, active_mtu_for);
        Ok(DeviceConfig {
            name: name.into(),
            addr,
            interface: iface,
            mtu,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: PortKind::default(),
            dpdk: String::new(),
            threads: 1,
            copy: CopyConfig::default(),
            engine: EngineConfig::default(),
        })
    }

    /// A device on `addr` over a link burst owns (DPDK): the address is
    /// burst's alone, not the host's; MTU 4096 unless set.
    pub fn owned_link(name: &str, addr: IpAddr) -> DeviceConfig {
        DeviceConfig {
            name: name.into(),
            addr,
            interface: None,
            mtu: Mtu::Mtu4096,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: PortKind::Dpdk,
            dpdk: String::new(),
            threads: 1,
            copy: CopyConfig::default(),
            engine: EngineConfig::default(),
        }
    }

    /// A device on interface `iface`: its first IPv4 address, else its
    /// first global IPv6 one.
    pub fn for_interface(name: &str, iface: &str) -> Result<DeviceConfig, ConfigError> {
        let if_mtu =
            netif::mtu(iface).map_err(|e| ConfigError::Interface(iface.into(), e.to_string()))?;
        let all =
            netif::addresses().map_err(|e| ConfigError::Interface(iface.into(), e.to_string()))?;
        let mine: Vec<IpAddr> = all
            .into_iter()
            .filter(|a| a.name == iface)
            .map(|a| a.ip)
            .collect();
        let addr = mine
            .iter()
            .find(|ip| ip.is_ipv4())
            .or_else(|| {
                mine.iter()
                    .find(|ip| matches!(ip, IpAddr::V6(v) if !v.is_unicast_link_local()))
            })
            .copied()
            .ok_or_else(|| {
                ConfigError::Interface(iface.into(), "has no usable IP address".into())
            })?;
        Ok(DeviceConfig {
            name: name.into(),
            addr,
            interface: Some(iface.into()),
            mtu: active_mtu_for(if_mtu),
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: PortKind::default(),
            dpdk: String::new(),
            threads: 1,
            copy: CopyConfig::default(),
            engine: EngineConfig::default(),
        })
    }
}

impl Config {
    /// The configuration from the process environment and the config file.
    pub fn from_env() -> Result<Config, ConfigError> {
        let path = std::env::var_os("BURST_CONFIG")
            .map(PathBuf::from)
            .or_else(|| {
                let xdg = std::env::var_os("XDG_CONFIG_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".config")));
                [
                    xdg.map(|x| x.join("burst/burst.toml")),
                    Some("/etc/burst/burst.toml".into()),
                ]
                .into_iter()
                .flatten()
                .find(|p| p.exists())
            });
        let text = match &path {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| ConfigError::File {
                path: p.clone(),
                msg: e.to_string(),
            })?),
            None => None,
        };
        let file = path.as_deref().zip(text.as_deref());
        Config::from_sources(|k| std::env::var(k).ok(), file)
    }

    /// The configuration from variables (`env`) and a file's `(path, text)`.
    pub fn from_sources(
        env: impl Fn(&str) -> Option<String>,
        file: Option<(&Path, &str)>,
    ) -> Result<Config, ConfigError> {
        let parsed: FileConfig = match file {
            Some((path, text)) => toml::from_str(text).map_err(|e| ConfigError::File {
                path: path.into(),
                msg: e.to_string(),
            })?,
            None => FileConfig::default(),
        };
        let mut devices = Vec::new();
        let port_env = env("BURST_PORT")
            .map(|p| parse_port("BURST_PORT", &p))
            .transpose()?;
        let addrs = env("BURST_ADDR").filter(|s| !s.trim().is_empty());
        let ifaces = env("BURST_IFACE").filter(|s| !s.trim().is_empty());
        if addrs.is_some() || ifaces.is_some() {
            for a in addrs.iter().flat_map(|s| s.split(',')).map(str::trim) {
                let ip: IpAddr = a.parse().map_err(|_| ConfigError::BadValue {
                    key: "BURST_ADDR".into(),
                    value: a.into(),
                    why: "an IPv4 or IPv6 address",
                })?;
                let name = format!("burst{}", devices.len());
                devices.push(if port_env == Some(PortKind::Dpdk) {
                    DeviceConfig::owned_link(&name, ip)
                } else {
                    DeviceConfig::for_addr(&name, ip)?
                });
            }
            for i in ifaces.iter().flat_map(|s| s.split(',')).map(str::trim) {
                devices.push(DeviceConfig::for_interface(
                    &format!("burst{}", devices.len()),
                    i,
                )?);
            }
        } else {
            for (n, d) in parsed.device.iter().enumerate() {
                devices.push(file_device(n, d, port_env)?);
            }
        }
        apply_env(&env, &mut devices, port_env)?;
        let daemon = env("BURST_DAEMON")
            .filter(|s| !s.trim().is_empty())
            .map(PathBuf::from)
            .or(parsed.daemon);
        if devices.is_empty() && daemon.is_none() {
            return Err(ConfigError::NotConfigured);
        }
        Ok(Config {
            devices,
            log: env("BURST_LOG").or(parsed.log),
            daemon,
        })
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&DeviceConfig> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// Device `n` of the config file, with the port `BURST_PORT` names (a
/// DPDK port owns its link: the address need not be the host's).
fn file_device(
    n: usize,
    d: &FileDevice,
    port_env: Option<PortKind>,
) -> Result<DeviceConfig, ConfigError> {
    let name = d.name.clone().unwrap_or_else(|| format!("burst{n}"));
    let mut dc = match (&d.address, &d.interface) {
        (Some(a), _) => {
            let ip: IpAddr = a.parse().map_err(|_| ConfigError::BadValue {
                key: format!("device {name}: address"),
                value: a.clone(),
                why: "an IPv4 or IPv6 address",
            })?;
            if d.port.as_deref() == Some("dpdk") || port_env == Some(PortKind::Dpdk) {
                DeviceConfig::owned_link(&name, ip)
            } else {
                DeviceConfig::for_addr(&name, ip)?
            }
        }
        (None, Some(i)) => DeviceConfig::for_interface(&name, i)?,
        (None, None) => {
            return Err(ConfigError::BadValue {
                key: format!("device {name}"),
                value: String::new(),
                why: "needs an address or an interface",
            })
        }
    };
    if let Some(m) = d.mtu {
        dc.mtu = parse_mtu(&format!("device {name}: mtu"), m)?;
    }
    if let Some(c) = &d.congestion_control {
        dc.congestion_control = parse_cc(&format!("device {name}: congestion_control"), c)?;
    }
    if let Some(p) = &d.port {
        dc.port = parse_port(&format!("device {name}: port"), p)?;
    }
    if let Some(a) = &d.dpdk {
        dc.dpdk.clone_from(a);
    }
    if let Some(c) = &d.copy {
        dc.copy.backend = parse_copy(&format!("device {name}: copy"), c)?;
    }
    if let Some(m) = d.copy_min {
        dc.copy.min_offload = m;
    }
    if let Some(t) = d.threads {
        dc.threads = parse_threads(&format!("device {name}: threads"), &t.to_string())?;
    }
    if let Some(c) = &d.engine_cpus {
        dc.engine.cpus = check_cpus(&format!("device {name}: engine_cpus"), c.clone())?;
    }
    if let Some(b) = d.busy_poll {
        dc.engine.busy_poll = b;
    }
    Ok(dc)
}

/// `value` of `key` as a number (`why` says what it must be).
fn parse_number<T: std::str::FromStr>(
    key: &str,
    value: &str,
    why: &'static str,
) -> Result<T, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError::BadValue {
        key: key.into(),
        value: value.into(),
        why,
    })
}

/// The environment's overrides (`BURST_MTU`, `BURST_TEST_DROP`, `BURST_CC`,
/// `BURST_PORT`, `BURST_THREADS`, the copy variables, `BURST_DPDK`) applied
/// to every device.
fn apply_env(
    env: &impl Fn(&str) -> Option<String>,
    devices: &mut [DeviceConfig],
    port_env: Option<PortKind>,
) -> Result<(), ConfigError> {
    if let Some(m) = env("BURST_MTU") {
        let v = parse_number("BURST_MTU", &m, "one of 256, 512, 1024, 2048, 4096")?;
        let mtu = parse_mtu("BURST_MTU", v)?;
        devices.iter_mut().for_each(|d| d.mtu = mtu);
    }
    if let Some(n) = env("BURST_TEST_DROP") {
        let v = parse_number("BURST_TEST_DROP", &n, "a whole number N (drop 1 in N)")?;
        devices.iter_mut().for_each(|d| d.drop_every = v);
    }
    if let Some(c) = env("BURST_CC") {
        let algo = parse_cc("BURST_CC", &c)?;
        devices.iter_mut().for_each(|d| d.congestion_control = algo);
    }
    if let Some(kind) = port_env {
        devices.iter_mut().for_each(|d| d.port = kind);
    }
    if let Some(t) = env("BURST_THREADS") {
        let n = parse_threads("BURST_THREADS", &t)?;
        devices.iter_mut().for_each(|d| d.threads = n);
    }
    if let Some(c) = env("BURST_ENGINE_CPUS").filter(|c| !c.trim().is_empty()) {
        let cpus = c
            .split(',')
            .map(|x| parse_number("BURST_ENGINE_CPUS", x, "comma-separated CPU numbers"))
            .collect::<Result<Vec<usize>, _>>()?;
        let cpus = check_cpus("BURST_ENGINE_CPUS", cpus)?;
        devices
            .iter_mut()
            .for_each(|d| d.engine.cpus.clone_from(&cpus));
    }
    if let Some(b) = env("BURST_BUSY_POLL") {
        let on = match b.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" | "" => false,
            _ => {
                return Err(ConfigError::BadValue {
                    key: "BURST_BUSY_POLL".into(),
                    value: b,
                    why: "1 or 0",
                })
            }
        };
        devices.iter_mut().for_each(|d| d.engine.busy_poll = on);
    }
    for d in devices.iter_mut() {
        d.copy = CopyConfig::from_vars(env, d.copy)?;
    }
    if let Some(a) = env("BURST_DPDK") {
        devices.iter_mut().for_each(|d| d.dpdk.clone_from(&a));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn variables_name_devices_in_order_and_override_the_file() {
        let file = "[[device]]\nname = \"x\"\naddress = \"127.0.0.9\"\n";
        let c = Config::from_sources(
            env(&[
                ("BURST_ADDR", "127.0.0.1, 127.0.0.2"),
                ("BURST_MTU", "2048"),
            ]),
            Some((Path::new("f.toml"), file)),
        )
        .unwrap();
        let names: Vec<_> = c.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["burst0", "burst1"]);
        assert!(c.devices.iter().all(|d| d.mtu == Mtu::Mtu2048));
        // Without variables the file's device is used, with lo's MTU.
        let c = Config::from_sources(env(&[]), Some((Path::new("f.toml"), file))).unwrap();
        assert_eq!(c.devices[0].name, "x");
        assert_eq!(c.devices[0].mtu, Mtu::Mtu4096, "lo's 65536-byte MTU");
        assert!(c.device("x").is_some() && c.device("burst0").is_none());
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = Config::from_sources(env(&[]), None).unwrap_err();
        assert!(matches!(e, ConfigError::NotConfigured));
        assert!(e.to_string().contains("BURST_ADDR"));
        let e = Config::from_sources(env(&[("BURST_ADDR", "198.18.0.250")]), None).unwrap_err();
        assert!(matches!(e, ConfigError::AddrNotOnHost(_)), "{e}");
        let e = Config::from_sources(env(&[("BURST_ADDR", "not-an-ip")]), None).unwrap_err();
        assert!(e.to_string().contains("not-an-ip"), "{e}");
        let e = Config::from_sources(env(&[("BURST_IFACE", "nosuch0")]), None).unwrap_err();
        assert!(e.to_string().contains("nosuch0"), "{e}");
        let e = Config::from_sources(
            env(&[("BURST_ADDR", "127.0.0.1"), ("BURST_MTU", "1500")]),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("BURST_MTU"), "{e}");
        let two = "[[device]]\naddress = \"127.0.0.1\"\nthreads = 2\nport = \"udp\"\n";
        let c = Config::from_sources(env(&[]), Some((Path::new("f"), two))).unwrap();
        assert_eq!(
            (c.devices[0].threads, c.devices[0].port),
            (2, PortKind::Udp)
        );
        let bad = "[[device]]\naddress = \"127.0.0.1\"\nthreads = 0\n";
        let e = Config::from_sources(env(&[]), Some((Path::new("f"), bad))).unwrap_err();
        assert!(e.to_string().contains("1 to 64"), "{e}");
        let e = Config::from_sources(
            env(&[("BURST_ADDR", "127.0.0.1"), ("BURST_PORT", "tcp")]),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("BURST_PORT"), "{e}");
        let e = Config::from_sources(env(&[]), Some((Path::new("f"), "[[device]]\nadress = 1\n")))
            .unwrap_err();
        assert!(matches!(e, ConfigError::File { .. }), "{e}");
    }

    #[test]
    fn interface_lo_resolves_to_its_ipv4_address() {
        let c = Config::from_sources(
            env(&[("BURST_IFACE", "lo"), ("BURST_TEST_DROP", "50")]),
            None,
        )
        .unwrap();
        assert_eq!(c.devices[0].addr, IpAddr::from([127, 0, 0, 1]));
        assert_eq!(c.devices[0].drop_every, 50);
        let c = Config::from_sources(env(&[("BURST_IFACE", "lo"), ("BURST_CC", "dcqcn")]), None)
            .unwrap();
        assert_eq!(c.devices[0].congestion_control.name(), "dcqcn");
        let bad = Config::from_sources(env(&[("BURST_IFACE", "lo"), ("BURST_CC", "cubic")]), None);
        assert!(matches!(bad, Err(ConfigError::BadValue { .. })), "{bad:?}");
    }

    #[test]
    fn the_copy_backend_comes_from_the_file_and_the_variables() {
        let c = Config::from_sources(env(&[("BURST_IFACE", "lo")]), None).unwrap();
        assert_eq!(c.devices[0].copy, CopyConfig::default());
        let file = "[[device]]\naddress = \"127.0.0.1\"\ncopy = \"cpu-plain\"\ncopy_min = 512\n";
        let c = Config::from_sources(env(&[]), Some((Path::new("b.toml"), file))).unwrap();
        assert_eq!(
            (c.devices[0].copy.backend, c.devices[0].copy.min_offload),
            (CopyBackend::CpuPlain, 512)
        );
        let c = Config::from_sources(
            env(&[("BURST_IFACE", "lo"), ("BURST_COPY", "dsa-model")]),
            None,
        )
        .unwrap();
        assert_eq!(c.devices[0].copy.backend, CopyBackend::DsaModel);
        for b in CopyBackend::ALL {
            assert_eq!(CopyBackend::from_name(b.name()), Some(b));
        }
        let e = Config::from_sources(env(&[("BURST_IFACE", "lo"), ("BURST_COPY", "gpu")]), None)
            .unwrap_err();
        assert!(e.to_string().contains("BURST_COPY"), "{e}");
        let e = Config::from_sources(
            env(&[("BURST_IFACE", "lo"), ("BURST_COPY_MIN", "4k")]),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("BURST_COPY_MIN"), "{e}");
    }
}
