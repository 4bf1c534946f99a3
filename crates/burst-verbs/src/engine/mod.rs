//! The engine: the one device API. It owns the data-plane core (the port
//! and the queue pairs), stepped by its own thread ([`Drive::Thread`]) or
//! only by the application ([`Drive::Caller`]), and hands out the
//! front-end handle applications use from any thread ([`Context`]).
//!
//! Applications never touch the transport. A posted work request is checked
//! once ([`burst_transport::QpConfig::check_send`]); then a thread that
//! finds the core free hands it straight to the transport, and otherwise it
//! goes into the QP's ring with a doorbell (the QP number pushed on a
//! multi-producer, single-consumer queue) for whoever steps the core next.
//! Completions are read from CQ rings. Ring entries are the transport's own
//! `SendWr`/`RecvWr`: no pointers, only integers (addresses in registered
//! memory, lengths, keys, QP numbers) and fixed arrays, so the same rings can
//! later live in memory shared between an application and a daemon process.
//! Memory registration goes straight to the shared [`MrTable`], which is
//! built for concurrent use.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam::channel::{bounded, Sender};

use crate::shm::Segment;

use burst_mem::MrTable;
use burst_wire::Mtu;

use crate::clock::Clock;
use crate::config::{Config, ConfigError, DeviceConfig};
use crate::Device;

mod ah;
mod control;
mod cq;
mod daemon;
mod drive;
mod drivers;
mod error;
mod events;
mod handles;
mod held;
mod lane;
mod memory;
mod open;
mod plane;
mod post;
mod qp;
mod rings;
mod wake;

use ah::*;
pub(crate) use control::*;
pub(crate) use cq::*;
pub use cq::{CompChannel, Cq, CqId};
pub use daemon::{ClientLayout, ClientLink, Owned};
use drive::Stepper;
pub use error::{CreateError, PostError};
use events::*;
pub use handles::{CompletionQueue, QueuePair, SharedReceiveQueue};
use held::*;
use lane::*;
pub use open::{device_list, open_device, open_port, open_ports};
pub(crate) use plane::{srq_shape, ControlPlane, InProcess, QpMade, Registration, SrqMade};
pub(crate) use rings::*;
pub(crate) use wake::*;

/// A region's owner, and the daemon's mapping of its pages (zero-copy).
type MrOwner = (u32, Option<Arc<Segment>>);

struct Shared {
    mrs: Arc<MrTable>,
    /// One MPSC doorbell queue per lane: posts reach the owning thread.
    /// (A daemon client's are its own, in memory it shares with burstd.)
    doorbells: Vec<Doorbells>,
    /// Every daemon client's doorbells (each for one lane).
    client_bells: ClientBells,
    /// How clients wake a sleeping lane (a daemon client: the daemon's).
    wake: Arc<Wake>,
    /// Rings go into memfds (a daemon: clients map them).
    memfd: bool,
    /// The owner of each protection domain (daemon clients; 0: this process).
    pd_owner: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
    /// Each memory region's owner and the daemon's mapping of its pages.
    mr_owner: std::sync::Mutex<std::collections::HashMap<u32, MrOwner>>,
    /// Each memory window's owner, by handle.
    mw_owner: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
    /// Address handles: who holds which (see [`AhTable`]).
    ahs: std::sync::Mutex<AhTable>,
    /// Indexed by QPN - FIRST_QPN.
    rings: std::sync::RwLock<Vec<Option<Arc<QpRings>>>>,
    srqs: std::sync::RwLock<Vec<Option<Arc<SrqRing>>>>,
    cqs: std::sync::RwLock<Vec<Option<Arc<Cq>>>>,
    /// Asynchronous events not yet taken by the application.
    events: AsyncEvents,
    stop: AtomicBool,
    /// The data plane's state. The engine thread steps it, and so does an
    /// application thread that finds it free while it waits for work
    /// (polls an empty CQ, posts, waits for a control reply): on a machine
    /// with fewer cores than spinning threads the work then happens on the
    /// thread that wants it, not after a scheduler time slice.
    /// One core per lane (engine thread), each with its own device (port
    /// queue, QPs); QPs never move between lanes.
    cores: Vec<std::sync::Mutex<Core>>,
    /// Who drives each lane now (see [`drivers`]).
    drivers: Vec<drivers::Drivers>,
    /// The device clock (the device holds a clone).
    clock: Clock,
    /// QP1's queues (the connection manager's MADs); a daemon client has
    /// none (QP1 is burstd's).
    gsi: Option<Arc<crate::gsi::Gsi>>,
}

impl Shared {
    /// Whether any doorbell of `lane` (the engine's own, or a client's)
    /// waits.
    fn bells_pending(&self, lane: usize) -> bool {
        if !self.doorbells[lane].queue.is_empty() {
            return true;
        }
        // QP1's MADs leave through lane 0 (gsi_send nudges it).
        if lane == 0 && self.gsi.as_ref().is_some_and(|g| g.has_transmit()) {
            return true;
        }
        let Some(clients) = self.client_bells.read() else {
            return false;
        };
        clients.iter().any(|b| {
            b.lane == lane && (!b.queue.is_empty() || b.overflow().load(Ordering::Relaxed) != 0)
        })
    }
}

/// The application's side of an engine: cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Context {
    shared: Arc<Shared>,
    /// The daemon client whose objects this handle reaches (0: the
    /// engine's own process). burstd gives each client its own.
    owner: u32,
    /// Where control verbs run: this process's lanes, or burstd.
    plane: Arc<dyn ControlPlane>,
    /// Each lane's control channel.
    control: Vec<Sender<Control>>,
    /// The lane the next QP goes to (round robin).
    next_lane: Arc<std::sync::atomic::AtomicUsize>,
    gid: [u8; 16],
    config: Arc<DeviceConfig>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context(gid {:?})", std::net::Ipv6Addr::from(self.gid))
    }
}

/// Who steps an engine's data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// An engine thread, and any application thread that polls or posts
    /// while the core is free (the default).
    Thread,
    /// Only the application's threads, when they post, poll or call
    /// [`Context::progress`]: no thread is started (simulations, and
    /// applications that run their own event loop).
    Caller,
    /// Busy polling: an engine thread per lane that owns its core and
    /// spins, never waiting in the kernel; application threads never step
    /// the lane (see [`crate::config::EngineConfig::busy_poll`]).
    Spin,
}

/// How [`Engine::with_port`] builds an engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The device's name (`ibv_get_device_name`).
    pub name: String,
    /// Active MTU of the port.
    pub port_mtu: Mtu,
    /// The memory-region table (a seeded one replays a simulation exactly).
    pub mrs: Arc<MrTable>,
    /// Who steps the data plane.
    pub drive: Drive,
    /// The device clock.
    pub clock: Clock,
    /// The network interface holding the device's address, when known:
    /// the GID table lists its addresses ([`Context::gid_table`]).
    pub interface: Option<String>,
    /// The loss the port injects (reported only; [`burst_io::LossyPort`] does it).
    pub drop_every: u64,
    /// Congestion control ([`burst_cc::Algorithm`]; a loss window per peer
    /// by default).
    pub congestion_control: burst_cc::Algorithm,
    /// Which kind of port it is (reported only).
    pub port: crate::config::PortKind,
    /// Rings in memfds that other processes can map (burstd), instead of
    /// anonymous memory.
    pub shared_rings: bool,
    /// What moves payload (each engine thread gets its own copier).
    pub copy: crate::config::CopyConfig,
    /// DPDK EAL arguments and keys (the `dmadev` copy backend's `dma=`).
    pub dpdk: String,
    /// CPUs the engine threads are pinned to, lane k on `cpus[k % len]`
    /// (empty: not pinned).
    pub cpus: Vec<usize>,
}

impl EngineOptions {
    /// Device `burst0` with a fresh memory-region table, an engine thread
    /// and the wall clock.
    pub fn new(port_mtu: Mtu) -> EngineOptions {
        EngineOptions {
            name: "burst0".into(),
            port_mtu,
            mrs: Arc::default(),
            drive: Drive::Thread,
            clock: Clock::wall(),
            interface: None,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: crate::config::PortKind::Udp,
            shared_rings: false,
            copy: Default::default(),
            dpdk: String::new(),
            cpus: Vec::new(),
        }
    }

    /// The options of configured device `cfg` (name, MTU, interface,
    /// congestion control, copy backend, engine CPUs and busy polling).
    pub fn for_device(cfg: &DeviceConfig) -> EngineOptions {
        let mut o = EngineOptions::new(cfg.mtu);
        o.name.clone_from(&cfg.name);
        o.interface.clone_from(&cfg.interface);
        o.drop_every = cfg.drop_every;
        o.congestion_control = cfg.congestion_control;
        o.port = cfg.port;
        o.copy = cfg.copy;
        o.dpdk.clone_from(&cfg.dpdk);
        o.cpus.clone_from(&cfg.engine.cpus);
        if cfg.engine.busy_poll {
            o.drive = Drive::Spin;
        }
        o
    }
}

/// A running engine (and its thread, if it has one); stops when dropped.
#[derive(Debug)]
pub struct Engine {
    ctx: Context,
    threads: Vec<JoinHandle<()>>,
}

/// Why [`Engine::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing (or something wrong) is configured.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No configured device has this name.
    #[error("burst: no device named {0:?} is configured")]
    NoSuchDevice(String),
    /// The port could not be opened (address in use, permission denied…).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Engine {
    /// Opens a device on `ip` (named `burst0`) and starts its engine thread.
    pub fn start(ip: IpAddr, port_mtu: Mtu) -> std::io::Result<Engine> {
        Engine::start_config(&DeviceConfig {
            name: "burst0".into(),
            addr: ip,
            interface: None,
            mtu: port_mtu,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: Default::default(),
            dpdk: String::new(),
            threads: 1,
            copy: Default::default(),
            engine: Default::default(),
        })
    }

    /// Opens the configured device `name` ([`device_list`]) and starts its engine.
    pub fn open(name: &str) -> Result<Engine, OpenError> {
        let cfg = Config::from_env()?;
        let dev = cfg
            .device(name)
            .ok_or_else(|| OpenError::NoSuchDevice(name.into()))?;
        Ok(Engine::start_config(dev)?)
    }

    /// Opens a device as `cfg` describes and starts its engine thread.
    pub fn start_config(cfg: &DeviceConfig) -> std::io::Result<Engine> {
        let ports = open_ports(cfg)?;
        Engine::with_ports(ports, EngineOptions::for_device(cfg))
    }

    /// An engine over any packet port (`burst_io::SimPort`, a wrapper
    /// such as `LossyPort`, a kernel-bypass port), driven and clocked as
    /// `o` says. Its address is the port's.
    ///
    /// ```
    /// use burst_io::{SimFaults, SimNet};
    /// use burst_verbs::engine::{Drive, Engine, EngineOptions};
    /// use burst_verbs::{clock::Clock, Mtu};
    /// let net = SimNet::new(1, SimFaults::default());
    /// let mut o = EngineOptions::new(Mtu::Mtu4096);
    /// o.drive = Drive::Caller;
    /// o.clock = Clock::manual();
    /// let e = Engine::with_port(net.port("198.18.0.1:4791".parse().unwrap()), o).unwrap();
    /// assert_eq!(e.context().gid()[12..], [198, 18, 0, 1]);
    /// ```
    pub fn with_port(
        port: impl burst_io::Port + Send + 'static,
        o: EngineOptions,
    ) -> std::io::Result<Engine> {
        Engine::with_ports(vec![Box::new(port) as crate::AnyPort], o)
    }

    /// An engine with one thread (lane) per port: each lane owns its port
    /// queue and the QPs placed on it (QPNs interleave, lane `k` of `n`
    /// numbering its QPs `0x11 + i * n + k`, so steering by destination QPN
    /// is arithmetic). The ports must deliver each lane's packets to it
    /// ([`burst_io::UdpPort::bind_lanes`] does, with a reuseport program).
    /// CQs, memory regions and events are shared; a QP with an SRQ goes to
    /// lane 0, where SRQs live.
    pub fn with_ports(ports: Vec<crate::AnyPort>, o: EngineOptions) -> std::io::Result<Engine> {
        let lanes = ports.len();
        if lanes == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an engine needs at least one port",
            ));
        }
        let addr = ports[0].local_addr().ip();
        let threaded = o.drive != Drive::Caller;
        let allowed = crate::thread::allowed_cpus();
        if let Some(c) = o.cpus.iter().find(|c| !allowed.contains(c)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("engine CPU {c}: this process may not run there (allowed: {allowed:?})"),
            ));
        }
        let mut drivers = Vec::new();
        let mut cores = Vec::new();
        let mut controls = Vec::new();
        let mut gid = [0u8; 16];
        let gsi = Arc::new(crate::gsi::Gsi::new()?);
        let mut link_events = None;
        for (k, port) in ports.into_iter().enumerate() {
            let mut d = drivers::Drivers::new(if threaded {
                Some(port.readiness()?)
            } else {
                None
            })?;
            d.busy = o.drive == Drive::Spin;
            drivers.push(d);
            let mut dev = Device::with_port(port, o.port_mtu, Arc::clone(&o.mrs));
            dev.set_clock(o.clock.clone());
            dev.set_congestion_control(o.congestion_control);
            dev.set_copier(crate::copy::open(&o.copy, &o.dpdk)?);
            dev.set_lane(k as u32, lanes as u32);
            dev.set_gsi(Arc::clone(&gsi));
            // One GID table per device: with several lanes (each a port of
            // its own) it stays the device's address alone.
            if let (Some(iface), 1) = (&o.interface, lanes) {
                dev.set_interface(iface);
            }
            // Port events once per device: from its first lane, by the
            // kernel's notifications where an engine thread waits for them.
            if let (Some(iface), 0) = (&o.interface, k) {
                dev.watch_link(iface);
                if threaded {
                    link_events = dev.follow_link_events();
                }
            }
            gid = dev.gid();
            let (control, control_rx) = bounded(64);
            controls.push(control);
            cores.push(std::sync::Mutex::new(Core {
                dev: Some(dev),
                held: Held::default(),
                control_rx,
                bells: Vec::new(),
                bad_input: 0,
                completed: Vec::new(),
                post_corked: false,
            }));
        }
        let shared = Arc::new(Shared {
            mrs: o.mrs,
            doorbells: (0..lanes)
                .map(|_| Doorbells::new())
                .collect::<std::io::Result<_>>()?,
            client_bells: Default::default(),
            wake: {
                let wake = Wake::new(lanes, o.shared_rings)?;
                if let Some(e) = link_events {
                    wake.watch_link(e)?;
                }
                Arc::new(wake)
            },
            memfd: o.shared_rings,
            pd_owner: Default::default(),
            mr_owner: Default::default(),
            mw_owner: Default::default(),
            ahs: Default::default(),
            rings: std::sync::RwLock::new(Vec::new()),
            srqs: std::sync::RwLock::new(Vec::new()),
            cqs: std::sync::RwLock::new(Vec::new()),
            events: AsyncEvents::new()?,
            stop: AtomicBool::new(false),
            cores,
            drivers,
            clock: o.clock,
            gsi: Some(gsi),
        });
        let ctx = Context {
            shared: Arc::clone(&shared),
            owner: 0,
            plane: Arc::new(InProcess),
            control: controls,
            next_lane: Arc::default(),
            gid,
            config: Arc::new(DeviceConfig {
                name: o.name,
                addr,
                interface: o.interface,
                mtu: o.port_mtu,
                drop_every: o.drop_every,
                congestion_control: o.congestion_control,
                port: o.port,
                dpdk: String::new(),
                threads: lanes as u32,
                copy: o.copy,
                engine: crate::config::EngineConfig {
                    cpus: o.cpus.clone(),
                    busy_poll: o.drive == Drive::Spin,
                },
            }),
        };
        let mut threads = Vec::new();
        for k in (0..lanes).filter(|_| threaded) {
            let shared = Arc::clone(&shared);
            let cpu = (!o.cpus.is_empty()).then(|| o.cpus[k % o.cpus.len()]);
            let spin = o.drive == Drive::Spin;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("burst-engine-{k}"))
                    .spawn(move || {
                        let _span = tracing::info_span!("burst-engine", %addr, lane = k).entered();
                        if let Some(cpu) = cpu {
                            // Checked against the affinity above; a
                            // failure here is logged, not fatal.
                            match crate::thread::pin_to(cpu) {
                                Ok(()) => tracing::info!(cpu, "engine pinned"),
                                Err(e) => tracing::warn!(cpu, "engine not pinned: {e}"),
                            }
                        }
                        tracing::info!(busy_poll = spin, "engine started");
                        if spin {
                            lane::spin(&shared, k);
                        } else {
                            run(&shared, k);
                        }
                        tracing::info!("engine stopped");
                    })?,
            );
        }
        Ok(Engine { ctx, threads })
    }

    /// A front-end handle.
    pub fn context(&self) -> Context {
        self.ctx.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.ctx.shared.stop.store(true, Ordering::Release);
        // Idle lanes wait in the kernel without a limit: wake them to stop.
        for lane in 0..self.ctx.shared.cores.len() {
            self.ctx.shared.wake.wake(lane);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Close the ports now, even if contexts outlive the engine.
        for core in &self.ctx.shared.cores {
            let mut core = core.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut dev) = core.dev.take() {
                // ACKs of the last packets received leave with the next
                // round: send them, or the peer retries into RETRY_EXC_ERR.
                dev.flush();
                tracing::debug!(counters = ?dev.counters(), "device closed");
            }
        }
    }
}
