//! The engine as burstd's and its clients': per-client links, ownership, and connecting to a daemon.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam::channel::bounded;
use crossbeam::queue::SegQueue;

use crate::shm::{Segment, ShmRing};

use burst_mem::Pd;
use burst_wire::{Mtu, Qpn};

use super::*;
use crate::clock::Clock;
use crate::config::DeviceConfig;
use crate::{AsyncEvent, SrqId, FIRST_QPN};

/// What burstd keeps per client in the engine: the segment the client
/// maps (its async-event ring, then one doorbell queue per lane) and the
/// write end of the pipe behind the client's async-event descriptor.
#[derive(Debug)]
pub struct ClientLink {
    pub(super) owner: u32,
    pub(super) seg: Arc<Segment>,
    pub(super) events: ShmRing<AsyncEvent>,
    pub(super) events_fd: crate::eventfd::EventFd,
    /// The layout, as [`crate::protocol::Reply::Hello`] announces it.
    pub layout: ClientLayout,
}

/// Where things sit in a client's segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLayout {
    /// Slots of the async-event ring at offset 0.
    pub event_slots: u32,
    /// Where lane 0's doorbells start.
    pub bells_offset: u64,
    /// Bytes per lane's doorbells.
    pub bells_stride: u64,
    /// Doorbells per lane.
    pub bells_depth: u32,
    /// Bytes of the segment.
    pub len: u64,
}

impl ClientLink {
    /// The segment to send to the client.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Queues an asynchronous event for the client and signals its fd
    /// (never blocks: the pipe's write end is the daemon's, non-blocking).
    pub fn push_event(&self, ev: AsyncEvent) {
        if self.events.push(ev).is_ok() {
            self.events_fd.signal();
        } else {
            tracing::warn!(client = self.owner, "async event ring full: {ev:?} dropped");
        }
    }
}

/// Everything one daemon client owns (the `burst` tool, cleanup).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    /// Protection domains.
    pub pds: Vec<u32>,
    /// Memory regions: (lkey, bytes, zero-copy mapping).
    pub mrs: Vec<(u32, u64, bool)>,
    /// CQs.
    pub cqs: Vec<CqId>,
    /// QPs.
    pub qps: Vec<Qpn>,
    /// SRQs.
    pub srqs: Vec<SrqId>,
}

/// Async events a client's ring holds.
pub(super) const CLIENT_EVENTS: usize = 256;

impl Context {
    /// This engine's handle for daemon client `owner`: every object it
    /// creates belongs to `owner`, and it reaches no other's.
    pub fn for_client(&self, owner: u32) -> Context {
        let mut c = self.clone();
        c.owner = owner;
        c
    }

    /// The client this handle acts for (0: the engine's own process).
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Sets up client `self.owner()`'s segment (async events and
    /// doorbells, which the engine starts reading now), the pipe behind its
    /// async-event descriptor and its wake pipes. Returns the link and the
    /// descriptors to send: the async events' read end, then one wake
    /// write end per lane.
    pub fn attach_client(&self) -> std::io::Result<(ClientLink, Vec<std::os::fd::OwnedFd>)> {
        let lanes = self.shared.doorbells.len();
        let event_bytes = ShmRing::<AsyncEvent>::bytes(CLIENT_EVENTS).div_ceil(64) * 64;
        let stride = Doorbells::bytes(Doorbells::CLIENT_DEPTH).div_ceil(64) * 64;
        let len = event_bytes + lanes * stride;
        let seg = Arc::new(Segment::memfd(
            &format!("burst-client-{}", self.owner),
            len,
        )?);
        let events = ShmRing::create(Arc::clone(&seg), 0, CLIENT_EVENTS)?;
        let (events_reader, events_fd) = crate::eventfd::EventFd::pipe(false)?;
        let mut handout: Vec<std::os::fd::OwnedFd> = vec![events_reader.into()];
        handout.extend(self.shared.wake.add_client(self.owner)?);
        let mut bells = Vec::new();
        for lane in 0..lanes {
            bells.push(Arc::new(Doorbells::create(
                Arc::clone(&seg),
                event_bytes + lane * stride,
                Doorbells::CLIENT_DEPTH,
                self.owner,
                None,
                lane,
            )?));
        }
        self.shared.client_bells.add(bells);
        let link = ClientLink {
            owner: self.owner,
            layout: ClientLayout {
                event_slots: CLIENT_EVENTS as u32,
                bells_offset: event_bytes as u64,
                bells_stride: stride as u64,
                bells_depth: Doorbells::CLIENT_DEPTH as u32,
                len: seg.len() as u64,
            },
            seg,
            events,
            events_fd,
        };
        Ok((link, handout))
    }

    /// The segment of words that say which lanes sleep (every client maps it).
    pub fn wake_segment(&self) -> &Segment {
        self.shared.wake.segment()
    }

    /// Every object client `self.owner()` owns.
    pub fn owned(&self) -> Owned {
        let o = self.owner;
        let sh = &self.shared;
        let mut pds: Vec<u32> = sh
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, w)| **w == o)
            .map(|(p, _)| *p)
            .collect();
        pds.sort_unstable();
        let mut mrs: Vec<(u32, u64, bool)> = sh
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (w, _))| *w == o)
            .map(|(k, (_, seg))| (*k, sh.mrs.lookup(*k).map_or(0, |r| r.len()), seg.is_some()))
            .collect();
        mrs.sort_unstable();
        let cqs = sh
            .cqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter(|(_, q)| q.as_ref().is_some_and(|q| q.owner == o))
            .map(|(i, _)| CqId(i as u32))
            .collect();
        let qps = sh
            .rings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .filter(|r| r.owner == o)
            .map(|r| r.qpn)
            .collect();
        let srqs = sh
            .srqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.owner == o))
            .map(|(i, _)| SrqId(i as u32))
            .collect();
        Owned {
            pds,
            mrs,
            cqs,
            qps,
            srqs,
        }
    }

    /// Destroys everything client `self.owner()` owns (it died or left):
    /// its QPs first (peers then meet a QP that no longer exists, as with
    /// an RNIC whose QP was destroyed), then SRQs, CQs, regions and PDs,
    /// and stops reading its doorbells.
    pub fn destroy_owned(&self) -> Owned {
        let all = self.owned();
        for q in &all.qps {
            if let Err(e) = self.destroy_qp(*q) {
                tracing::warn!(qpn = q.value(), "cleanup: destroy QP: {e}");
            }
        }
        for s in &all.srqs {
            if let Err(e) = self.destroy_srq(*s) {
                tracing::warn!(srq = s.0, "cleanup: destroy SRQ: {e}");
            }
        }
        for c in &all.cqs {
            if let Err(e) = self.destroy_cq(*c) {
                tracing::warn!(cq = c.0, "cleanup: destroy CQ: {e:?}");
            }
        }
        // Windows before regions: a region with windows bound stays.
        let windows: Vec<u32> = self
            .shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, o)| **o == self.owner)
            .map(|(h, _)| *h)
            .collect();
        for h in windows {
            if let Err(e) = self.dealloc_mw(h) {
                tracing::warn!(handle = h, "cleanup: dealloc MW: {e}");
            }
        }
        let ahs: Vec<u32> = self
            .shared
            .ahs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_index
            .iter()
            .filter(|(_, k)| k.0 == self.owner)
            .map(|(i, _)| *i)
            .collect();
        for ah in ahs {
            if let Err(e) = self.release_ah(ah, true) {
                tracing::warn!(ah, "cleanup: destroy AH: {e}");
            }
        }
        for (k, _, _) in &all.mrs {
            if let Err(e) = self.dereg_mr(*k) {
                tracing::warn!(lkey = k, "cleanup: deregister: {e}");
            }
        }
        for p in &all.pds {
            if let Err(e) = self.dealloc_pd(Pd(*p)) {
                tracing::warn!(pd = p, "cleanup: dealloc PD: {e:?}");
            }
        }
        self.shared.client_bells.remove(self.owner);
        self.shared.wake.remove_client(self.owner);
        all
    }

    /// The client that owns QP `qpn` (event routing).
    pub fn owner_of_qp(&self, qpn: Qpn) -> Option<u32> {
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        match rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Some(Some(r)) => Some(r.owner),
            _ => None,
        }
    }

    /// The client that owns CQ `cq` (event routing).
    pub fn owner_of_cq(&self, cq: CqId) -> Option<u32> {
        let cqs = self.shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        cqs.get(cq.0 as usize)?.as_ref().map(|c| c.owner)
    }

    /// The client that owns SRQ `srq` (event routing).
    pub fn owner_of_srq(&self, srq: SrqId) -> Option<u32> {
        let srqs = self.shared.srqs.read().unwrap_or_else(|e| e.into_inner());
        srqs.get(srq.0 as usize)?.as_ref().map(|s| s.owner)
    }

    /// Whether this is a daemon client whose daemon is gone (every verb
    /// fails; the async fd reported `DeviceFatal`).
    pub fn device_failed(&self) -> bool {
        self.plane.gone()
    }

    /// Sends `req` to burstd and returns its reply (the `burst` tool's
    /// queries); `Invalid` on an embedded context.
    pub fn daemon_request(
        &self,
        req: &crate::protocol::Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(crate::protocol::Reply, Vec<std::os::fd::OwnedFd>), PostError> {
        self.plane.request(req, fds)
    }

    /// burstd's number for this client.
    pub fn client_id(&self) -> Option<u32> {
        self.plane.client_id()
    }

    /// Whether this context is a burstd client.
    pub fn is_daemon_client(&self) -> bool {
        self.plane.client_id().is_some()
    }

    /// A daemon client's context: `seg` is its segment (async-event ring,
    /// then each lane's doorbells, as `layout` says), `wake` the daemon's
    /// wake segment with one pipe per lane, `events` the read end of its
    /// async-event pipe; control verbs go to `plane`.
    pub(crate) fn attached(
        device: crate::protocol::DeviceInfo,
        layout: ClientLayout,
        seg: Arc<Segment>,
        wake: Wake,
        events: std::os::fd::OwnedFd,
        plane: Arc<dyn ControlPlane>,
    ) -> std::io::Result<Context> {
        let lanes = device.lanes.max(1) as usize;
        let wake = Arc::new(wake);
        let doorbells = (0..lanes)
            .map(|l| {
                Doorbells::attach(
                    Arc::clone(&seg),
                    layout.bells_offset as usize + l * layout.bells_stride as usize,
                    layout.bells_depth as usize,
                    Some(Arc::clone(&wake)),
                    l,
                )
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let events = AsyncEvents {
            fd: crate::eventfd::EventFd::pipe_reader(events),
            queue: SegQueue::new(),
            remote: Some(ShmRing::attach(
                Arc::clone(&seg),
                0,
                layout.event_slots as usize,
            )?),
            port_down: AtomicBool::new(false),
        };
        let shared = Arc::new(Shared {
            mrs: Arc::default(),
            doorbells,
            client_bells: Default::default(),
            wake,
            memfd: false,
            pd_owner: Default::default(),
            mr_owner: Default::default(),
            mw_owner: Default::default(),
            ahs: Default::default(),
            rings: Default::default(),
            srqs: Default::default(),
            cqs: Default::default(),
            events,
            stop: AtomicBool::new(false),
            cores: Vec::new(),
            drivers: Vec::new(),
            clock: Clock::wall(),
            gsi: None,
        });
        let mtu = Mtu::from_bytes(device.mtu as usize).unwrap_or(Mtu::Mtu1024);
        Ok(Context {
            shared,
            owner: 0,
            plane,
            control: (0..lanes).map(|_| bounded(1).0).collect(),
            next_lane: Arc::default(),
            gid: device.gid,
            config: Arc::new(DeviceConfig {
                name: device.name,
                addr: device.addr,
                interface: device.interface,
                mtu,
                drop_every: 0,
                congestion_control: burst_cc::Algorithm::default(),
                port: Default::default(),
                dpdk: String::new(),
                threads: lanes as u32,
                copy: Default::default(),
                engine: Default::default(),
            }),
        })
    }

    /// Reports the device lost (`DeviceFatal` on the async fd) while the
    /// context lives: what a client does when burstd is gone.
    pub(crate) fn fatal_notice(&self) -> impl Fn() + Send + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || {
            if let Some(sh) = shared.upgrade() {
                sh.events.push(AsyncEvent::DeviceFatal);
            }
        }
    }
}
