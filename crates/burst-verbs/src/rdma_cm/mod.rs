//! rdma_cm in Rust: connection setup by IP address over burst's devices,
//! with the semantics librdmacm and the kernel's RDMA CM give
//! applications. The C drop-in (`librdmacm.so.1`) is a translation of
//! rdma-core's structs onto this module.
//!
//! - [`RdmaCm`]: a process's rdma_cm: its devices (each with a
//!   [`crate::cm::CmService`] on QP1), listens, connections and
//!   ports.
//! - [`EventChannel`]: where an id's [`CmEvent`]s queue, with a pollable
//!   descriptor (one count per event).
//! - [`CmId`]: an rdma_cm id: bind, listen, resolve address and route,
//!   connect, accept, reject, disconnect; RC/UC by the IB CM's
//!   REQ/REP/RTU, UD by SIDR. The QP attached to it ([`CmQp`]) is moved
//!   through INIT, RTR and RTS with what the two sides agreed on.
//!
//! Works the same with an embedded engine and as a burstd client (the
//! daemon owns QP1 and routes each MAD to the client it is for).
//!
//! ECE: an RC REQ offers burst's options ([`crate::Ece`]), the REP answers what
//! both offer, and both QPs repeat selectively when that includes it.
//!
//! Not yet: multicast, alternate paths, IPv6 link-local scopes.
//!
//! ```no_run
//! use burst_verbs::rdma_cm::{CmEventKind, EventChannel, PortSpace, RdmaCm};
//! use burst_verbs::config::Config;
//!
//! let cm = RdmaCm::from_config(&Config::from_env()?);
//! let ch = EventChannel::new()?;
//! let listener = cm.create_id(&ch, PortSpace::Tcp);
//! listener.bind_addr("0.0.0.0:7471".parse()?)?;
//! listener.listen()?;
//! let ev = ch.get_event()?;
//! assert_eq!(ev.kind, CmEventKind::ConnectRequest);
//! ev.id.reject(b"not today")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr;
mod channel;
mod conn;
mod events;
mod id;
mod qp;

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

pub use burst_cm::rdma::PortSpace;

pub use self::channel::{CmEvent, CmEventKind, ConnParam, EventChannel, EventParam, UdParam};
pub use self::id::{CmId, Route};
pub use self::qp::{AddressVector, CmQp, CmQpAttr};

use crate::cm::CmService;
use crate::config::Config;
use crate::engine::{Context, Engine};
use crate::Mtu;

/// Opens device `index` of an [`RdmaCm`] (called once per device, on
/// first use).
pub type DeviceOpener = Box<dyn Fn(usize) -> io::Result<Context> + Send + Sync>;

/// A process's rdma_cm (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct RdmaCm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RdmaCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaCm")
            .field("addrs", &self.shared.addrs)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Shared {
    /// Each device's IP address (the index is the device's).
    addrs: Vec<IpAddr>,
    open: DeviceOpener,
    devices: Mutex<Vec<Option<Arc<Device>>>>,
    reg: Mutex<Registry>,
}

/// The CM side of one device.
pub(crate) struct Device {
    pub(crate) index: usize,
    pub(crate) ctx: Context,
    pub(crate) svc: CmService,
    pub(crate) gid: [u8; 16],
    /// The index of `gid` in the device's GID table: the source the
    /// address vectors name (as the kernel's CM finds the bound address's).
    pub(crate) sgid_index: u8,
    /// Active MTU, as `enum ibv_mtu` (what the CM messages carry).
    pub(crate) mtu: u8,
    pub(crate) max_rd_atomic: u8,
}

/// Which id a connection, a listen or a port belongs to.
#[derive(Default)]
struct Registry {
    conns: HashMap<(usize, u32), CmId>,
    listeners: Vec<CmId>,
    /// (port space, port) held by an id.
    ports: HashSet<(u32, u16)>,
}

impl RdmaCm {
    /// An rdma_cm over devices with addresses `addrs`, opened by `open`
    /// when first needed (the C drop-in opens its own `ibv_context`s).
    pub fn new(addrs: Vec<IpAddr>, open: DeviceOpener) -> RdmaCm {
        RdmaCm {
            shared: Arc::new(Shared {
                devices: Mutex::new(vec![None; addrs.len()]),
                addrs,
                open,
                reg: Mutex::new(Registry::default()),
            }),
        }
    }

    /// An rdma_cm over the devices of `config`: embedded engines, or
    /// burstd's device when `BURST_DAEMON` (or `daemon =`) is set.
    pub fn from_config(config: &Config) -> RdmaCm {
        if let Some(sock) = &config.daemon {
            // burstd's one device, through one client context.
            return match Context::connect(sock) {
                Ok(ctx) => RdmaCm::new(vec![ctx.config().addr], Box::new(move |_| Ok(ctx.clone()))),
                Err(e) => {
                    tracing::warn!("rdma_cm: burstd at {}: {e}", sock.display());
                    RdmaCm::new(Vec::new(), Box::new(|_| Err(errno(libc::ENODEV))))
                }
            };
        }
        RdmaCm::with_devices(config.devices.clone())
    }

    /// An rdma_cm over embedded engines for `devices`, each started on
    /// first use and running as long as the rdma_cm.
    pub fn with_devices(devices: Vec<crate::config::DeviceConfig>) -> RdmaCm {
        let addrs = devices.iter().map(|d| d.addr).collect();
        let engines: Mutex<Vec<Engine>> = Mutex::new(Vec::new());
        RdmaCm::new(
            addrs,
            Box::new(move |i| {
                let cfg = devices.get(i).ok_or(io::ErrorKind::NotFound)?;
                let engine = Engine::start_config(cfg)?;
                let ctx = engine.context();
                engines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(engine);
                Ok(ctx)
            }),
        )
    }

    /// What the kernel's CM does when a process's RDMA CM file closes:
    /// every connection still up is released (a DREQ for an established
    /// one, so the peer learns of it at once instead of when its retries
    /// run out), then waits, at most `within`, for the DREPs as
    /// [`RdmaCm::finish_disconnects`]. For a process that ends without
    /// destroying its ids (Valkey's RDMA test client exits with its
    /// connections up). Returns how many DREQs were still unanswered.
    pub fn close_all(&self, within: std::time::Duration) -> usize {
        for d in self.started() {
            d.svc.release_all();
        }
        self.finish_disconnects(within)
    }

    /// The devices whose CM started.
    fn started(&self) -> Vec<Arc<Device>> {
        self.shared
            .devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Waits, at most `within`, until every DREQ this process sent was
    /// answered (sending unanswered ones again meanwhile); what a process
    /// that embeds its CM does before it ends (see
    /// [`CmService::finish_disconnects`](crate::cm::CmService::finish_disconnects)).
    /// Returns how many were still unanswered.
    pub fn finish_disconnects(&self, within: std::time::Duration) -> usize {
        let started = self.started();
        let deadline = std::time::Instant::now() + within;
        started
            .iter()
            .map(|d| {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                d.svc.finish_disconnects(left)
            })
            .sum()
    }

    /// Each started device's CM counters as a line (what the CM logs
    /// when it closes): for a process-wide instance that is never
    /// dropped, printed at exit by its owner.
    pub fn counters_lines(&self, when: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for d in self.started() {
            let Some(line) = d.svc.counters_line(when) else {
                continue;
            };
            lines.push(line);
            // How the connections' traffic recovered: selective repeat is
            // what the REQ and REP agreed between burst peers.
            if let Ok(c) = d.ctx.counters() {
                lines.push(format!(
                    "device {} {when}: {} packets sent, {} received, {} retransmitted in {} go-backs; \
                     selective repeat: {} packets held past a hole, {} probes, {} go-backs",
                    self.shared.addrs[d.index],
                    c.sent_pkts,
                    c.rcvd_pkts,
                    c.qps.retransmitted_pkts,
                    c.qps.retransmits_started,
                    c.qps.sr_held_pkts,
                    c.qps.sr_probes,
                    c.qps.sr_go_backs
                ));
            }
        }
        lines
    }

    /// How many devices it covers.
    pub fn device_count(&self) -> usize {
        self.shared.addrs.len()
    }

    /// Device `index`'s context (opened, and its CM started, on first use).
    pub fn context(&self, index: usize) -> io::Result<Context> {
        Ok(self.shared.device(index)?.ctx.clone())
    }

    /// A new id whose events go to `channel`, of the QP type its port
    /// space implies (UD for UDP and IPoIB, RC otherwise).
    pub fn create_id(&self, channel: &EventChannel, ps: PortSpace) -> CmId {
        let qp_type = if ps.is_datagram() {
            crate::QpType::Ud
        } else {
            crate::QpType::Rc
        };
        self.create_id_with(channel, ps, qp_type)
    }

    /// A new id of `qp_type` (`rdma_create_ep`'s `ai_qp_type`).
    pub fn create_id_with(
        &self,
        channel: &EventChannel,
        ps: PortSpace,
        qp_type: crate::QpType,
    ) -> CmId {
        CmId::new(&self.shared, channel, ps, qp_type)
    }
}

impl Shared {
    /// Device `index`'s CM, started on first use.
    pub(crate) fn device(self: &Arc<Self>, index: usize) -> io::Result<Arc<Device>> {
        self.device_listening(index, None)
    }

    /// [`Shared::device`], its CM listening on `service_id` too; a CM
    /// started for it listens before it takes its first MAD.
    pub(crate) fn device_listening(
        self: &Arc<Self>,
        index: usize,
        service_id: Option<u64>,
    ) -> io::Result<Arc<Device>> {
        let mut all = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = all.get_mut(index) else {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        };
        if let Some(d) = slot {
            let d = Arc::clone(d);
            drop(all);
            if let Some(id) = service_id {
                d.svc.listen(id)?;
            }
            return Ok(d);
        }
        let ctx = (self.open)(index)?;
        let weak: Weak<Shared> = Arc::downgrade(self);
        let svc = CmService::start_listening(
            &ctx,
            Box::new(move |e| {
                if let Some(shared) = weak.upgrade() {
                    events::on_cm_event(&shared, index, e);
                }
            }),
            service_id,
        )?;
        let attr = ctx.query_device();
        let d = Arc::new(Device {
            index,
            gid: ctx.gid(),
            sgid_index: ctx.sgid_index_for(ctx.gid()),
            mtu: ctx.query_port().active_mtu.ibv_mtu(),
            max_rd_atomic: attr.max_qp_rd_atom.min(255) as u8,
            svc,
            ctx,
        });
        *slot = Some(Arc::clone(&d));
        Ok(d)
    }

    fn with_reg<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        f(&mut self.reg.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn register_conn(&self, dev: usize, conn: burst_cm::ConnId, id: &CmId) {
        self.with_reg(|r| r.conns.insert((dev, conn.0), id.clone()));
    }

    fn unregister_conn(&self, dev: usize, conn: burst_cm::ConnId) {
        self.with_reg(|r| r.conns.remove(&(dev, conn.0)));
    }

    fn conn_id(&self, dev: usize, conn: burst_cm::ConnId) -> Option<CmId> {
        self.with_reg(|r| r.conns.get(&(dev, conn.0)).cloned())
    }

    /// Takes `port` (0: an ephemeral one) in `ps`.
    fn take_port(&self, ps: PortSpace, port: u16) -> io::Result<u16> {
        const FIRST: u16 = 32768;
        const LAST: u16 = 60999;
        self.with_reg(|r| {
            let key = |p| (ps.value(), p);
            if port != 0 {
                if !r.ports.insert(key(port)) {
                    return Err(io::Error::from_raw_os_error(libc::EADDRINUSE));
                }
                return Ok(port);
            }
            // The kernel's default ephemeral range, from a random start.
            let mut seed = [0u8; 2];
            let _ = getrandom::fill(&mut seed);
            let span = LAST - FIRST;
            let start = u16::from_ne_bytes(seed) % span;
            (0..span)
                .map(|i| FIRST + (start + i) % span)
                .find(|&p| r.ports.insert(key(p)))
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EADDRNOTAVAIL))
        })
    }

    fn release_port(&self, ps: PortSpace, port: u16) {
        self.with_reg(|r| r.ports.remove(&(ps.value(), port)));
    }
}

/// `enum ibv_mtu` to the transport's MTU (the largest for anything above).
pub(crate) fn mtu_of(ibv: u8) -> Mtu {
    Mtu::from_ibv_mtu(ibv).unwrap_or(Mtu::Mtu4096)
}

/// The errno as an `io::Error`.
pub(crate) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}
