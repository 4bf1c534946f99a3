//! Opening a configured device: its ports (UDP, AF_XDP, DPDK) and lanes.

use super::*;
use crate::config::{Config, ConfigError, DeviceConfig};
use crate::FIRST_QPN;

/// `e` (from opening `cfg`'s port) with what to change in its message; the
/// kind stays, so callers still map it to an errno (`EADDRINUSE`, ...).
pub(super) fn with_remedy(e: std::io::Error, cfg: &DeviceConfig) -> std::io::Error {
    use std::io::ErrorKind;
    let remedy = match e.kind() {
        ErrorKind::AddrInUse => format!(
            "UDP port {} on {} is taken (another burst process, kernel RXE on this address, \
             or another RoCEv2 stack): give device {} another address of this host \
             (BURST_ADDR, or its addr in BURST_CONFIG), or stop what holds the port",
            burst_wire::ROCEV2_PORT,
            cfg.addr,
            cfg.name
        ),
        ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: set BURST_ADDR (or BURST_IFACE) to one",
            cfg.addr
        ),
        _ => return e,
    };
    std::io::Error::new(e.kind(), format!("{e}; {remedy}"))
}

/// The device an application opens: burstd's when `BURST_DAEMON` (or
/// `daemon` in the configuration file) names its socket (daemon mode; `cfg`
/// is then the daemon's business), else an
/// engine of its own on `cfg` (embedded mode). Keep the engine while the
/// context is used.
pub fn open_device(cfg: &DeviceConfig) -> std::io::Result<(Option<Engine>, Context)> {
    // The variable, else `daemon = ...` in the configuration file.
    let daemon = std::env::var_os("BURST_DAEMON")
        .filter(|s| !s.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| Config::from_env().ok().and_then(|c| c.daemon));
    match daemon {
        Some(sock) => Ok((None, Context::connect(&sock)?)),
        None => {
            let e = Engine::start_config(cfg)?;
            let c = e.context();
            Ok((Some(e), c))
        }
    }
}

/// The packet port `cfg` names ([`DeviceConfig::port`]): a UDP socket, an
/// AF_XDP socket or a DPDK port, with its test loss. Errors say what to
/// change (an address in use, a feature not built, an interface without XDP).
pub fn open_port(cfg: &DeviceConfig) -> std::io::Result<crate::AnyPort> {
    Ok(match cfg.port {
        crate::config::PortKind::Udp => {
            let udp = burst_io::UdpPort::bind(cfg.addr).map_err(|e| with_remedy(e, cfg))?;
            lossy(udp, cfg.drop_every)
        }
        crate::config::PortKind::AfXdp { generic } => {
            lossy(open_af_xdp(cfg, generic)?, cfg.drop_every)
        }
        crate::config::PortKind::Dpdk => open_dpdk_lanes(cfg, 1)?.remove(0),
    })
}

/// One port per engine thread of `cfg` ([`DeviceConfig::threads`]): for
/// the UDP port, sockets in a reuseport group steered by destination QPN.
pub fn open_ports(cfg: &DeviceConfig) -> std::io::Result<Vec<crate::AnyPort>> {
    let lanes = cfg.threads.max(1) as usize;
    if lanes == 1 {
        return Ok(vec![open_port(cfg)?]);
    }
    match cfg.port {
        crate::config::PortKind::Udp => {
            Ok(burst_io::UdpPort::bind_lanes(cfg.addr, lanes, FIRST_QPN)
                .map_err(|e| with_remedy(e, cfg))?
                .into_iter()
                .map(|p| lossy(p, cfg.drop_every))
                .collect())
        }
        crate::config::PortKind::Dpdk => open_dpdk_lanes(cfg, lanes),
        crate::config::PortKind::AfXdp { generic } => open_af_xdp_lanes(cfg, generic, lanes),
    }
}

/// The DPDK port of `cfg` (`BURST_DPDK`), one queue pair per engine thread.
#[cfg(feature = "dpdk")]
pub(super) fn open_dpdk_lanes(
    cfg: &DeviceConfig,
    lanes: usize,
) -> std::io::Result<Vec<crate::AnyPort>> {
    let d = burst_io::dpdk::DpdkConfig::parse(&cfg.dpdk);
    let ports =
        burst_io::dpdk::open_lane_ports(&d, cfg.addr, lanes as u16, FIRST_QPN).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "device {}: {e}; the UDP port works without DPDK (BURST_PORT=udp)",
                    cfg.name
                ),
            )
        })?;
    if let Some(p) = ports.first() {
        tracing::info!(
            "device {}: DPDK {} (port {}), {lanes} queue pair(s), EAL {:?}",
            cfg.name,
            burst_io::raw::FrameLink::name(p.link()),
            p.link().port_id(),
            d.eal_args()
        );
    }
    Ok(ports
        .into_iter()
        .map(|p| lossy(p, cfg.drop_every))
        .collect())
}

#[cfg(not(feature = "dpdk"))]
pub(super) fn open_dpdk_lanes(
    cfg: &DeviceConfig,
    _lanes: usize,
) -> std::io::Result<Vec<crate::AnyPort>> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "device {}: BURST_PORT=dpdk, but this burst was built without the dpdk feature \
             (cargo build --features dpdk); the UDP port works without it (BURST_PORT=udp)",
            cfg.name
        ),
    ))
}

/// `port`, dropping one sent packet in `drop_every` if that is not 0.
pub(super) fn lossy(port: impl burst_io::Port + Send + 'static, drop_every: u64) -> crate::AnyPort {
    match drop_every {
        0 => Box::new(port),
        n => Box::new(burst_io::LossyPort::new(port, n)),
    }
}

/// The AF_XDP port of `cfg`'s interface.
#[cfg(feature = "af-xdp")]
pub(super) fn open_af_xdp(
    cfg: &DeviceConfig,
    generic: bool,
) -> std::io::Result<burst_io::raw::RawPort<burst_io::xsk::XskLink>> {
    let (iface, x) = xsk_config(cfg, generic)?;
    let port = burst_io::xsk::open_port(&x, cfg.addr).map_err(|e| af_xdp_error(e, cfg, &iface))?;
    log_af_xdp(cfg, &iface, port.link(), 1);
    Ok(port)
}

/// The interface of `cfg` and the socket configuration for it.
#[cfg(feature = "af-xdp")]
fn xsk_config(
    cfg: &DeviceConfig,
    generic: bool,
) -> std::io::Result<(String, burst_io::xsk::XskConfig)> {
    let iface = cfg.interface.as_deref().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "device {}: AF_XDP needs an interface (BURST_IFACE)",
                cfg.name
            ),
        )
    })?;
    let mut x = burst_io::xsk::XskConfig::new(iface);
    if generic {
        x.mode = burst_io::xdp::XdpMode::Generic;
    }
    Ok((iface.to_string(), x))
}

#[cfg(feature = "af-xdp")]
fn af_xdp_error(e: std::io::Error, cfg: &DeviceConfig, iface: &str) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!(
            "device {} on {iface}: {e}; the UDP port works without it (BURST_PORT=udp)",
            cfg.name
        ),
    )
}

#[cfg(feature = "af-xdp")]
fn log_af_xdp(cfg: &DeviceConfig, iface: &str, l: &burst_io::xsk::XskLink, lanes: usize) {
    tracing::info!(
        "device {}: AF_XDP on {iface} queue(s) {}..{}, XDP {:?}, {}, {}",
        cfg.name,
        l.queue(),
        l.queue() as usize + lanes,
        l.xdp_mode(),
        if l.zero_copy() {
            "zero-copy"
        } else {
            "copy mode"
        },
        if l.multi_buffer() {
            "multi-buffer"
        } else {
            "single-buffer frames"
        }
    );
}

/// The AF_XDP port of `cfg` as `lanes` ports, one socket per receive queue
/// of its interface (which needs that many queues).
#[cfg(feature = "af-xdp")]
fn open_af_xdp_lanes(
    cfg: &DeviceConfig,
    generic: bool,
    lanes: usize,
) -> std::io::Result<Vec<crate::AnyPort>> {
    let (iface, x) = xsk_config(cfg, generic)?;
    let ports = burst_io::xsk::open_lane_ports(&x, cfg.addr, lanes as u32, FIRST_QPN)
        .map_err(|e| af_xdp_error(e, cfg, &iface))?;
    if let Some(p) = ports.first() {
        log_af_xdp(cfg, &iface, p.link(), lanes);
    }
    Ok(ports
        .into_iter()
        .map(|p| lossy(p, cfg.drop_every))
        .collect())
}

#[cfg(not(feature = "af-xdp"))]
fn open_af_xdp_lanes(
    cfg: &DeviceConfig,
    generic: bool,
    _lanes: usize,
) -> std::io::Result<Vec<crate::AnyPort>> {
    Ok(vec![lossy(open_af_xdp(cfg, generic)?, cfg.drop_every)])
}

#[cfg(not(feature = "af-xdp"))]
pub(super) fn open_af_xdp(
    cfg: &DeviceConfig,
    _generic: bool,
) -> std::io::Result<burst_io::UdpPort> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "device {}: BURST_PORT=af-xdp, but this burst was built without the af-xdp \
             feature (cargo build --features af-xdp); the UDP port works without it \
             (BURST_PORT=udp)",
            cfg.name
        ),
    ))
}

/// The configured devices (`ibv_get_device_list`): see [`crate::config`].
pub fn device_list() -> Result<Vec<DeviceConfig>, ConfigError> {
    Ok(Config::from_env()?.devices)
}
