//! An rdma_cm id: its state and the calls on it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use burst_cm::rdma::{CmaHeader, PortSpace};
use burst_cm::ConnId;

use super::qp::{attr_for, Negotiated, QpPlan};
use super::{
    addr, errno, AddressVector, CmEvent, CmEventKind, CmQp, CmQpAttr, Device, EventChannel,
    EventParam, Shared, UdParam,
};
use crate::engine::{CompletionQueue, QueuePair};
use crate::{gid_of, Mtu, QpInit, QpState, QpType};

/// Where an id is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    /// REQ or SIDR_REQ sent.
    Connecting,
    /// Passive: the request is the application's to answer.
    RequestRcvd,
    /// Active: REP received, no QP (rping -q): `establish` is next.
    RepRcvd,
    /// Passive: REP sent, waiting for the RTU.
    Accepting,
    Established,
    Disconnected,
    Destroyed,
}

pub(super) struct State {
    pub phase: Phase,
    pub ps: PortSpace,
    pub qp_type: QpType,
    pub dev: Option<usize>,
    /// The device's GID index for its address ([`Device::sgid_index`]).
    pub sgid_index: u8,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    /// The port this id holds in its space (released on destroy).
    pub port_held: Option<u16>,
    pub conn: Option<ConnId>,
    pub peer: Option<IpAddr>,
    pub neg: Negotiated,
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`.
    pub ack_timeout: Option<u8>,
    /// `rdma_set_local_ece`: what this id's REQ or REP carries instead of
    /// burst's own offer (an application that manages its QP's ECE).
    pub local_ece: Option<crate::Ece>,
    /// The ECE the peer's REQ or REP carried (`rdma_get_remote_ece`).
    pub remote_ece: crate::Ece,
}

impl State {
    fn on_device(&mut self, d: &Device) {
        self.dev = Some(d.index);
        self.sgid_index = d.sgid_index;
    }

    fn plan(&self, qp_type: QpType) -> QpPlan {
        QpPlan {
            qp_type,
            connected: matches!(
                self.phase,
                Phase::RequestRcvd
                    | Phase::Accepting
                    | Phase::RepRcvd
                    | Phase::Established
                    | Phase::Connecting
            ),
            neg: self.neg,
            av: self.peer.map(|p| AddressVector {
                dgid: gid_of(p),
                sgid_index: self.sgid_index,
                hop_limit: 64,
            }),
        }
    }
}

/// An rdma_cm id (`struct rdma_cm_id`). Cheap to clone: clones are the
/// same id. It lives until [`CmId::destroy`], as with `rdma_destroy_id`.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<Inner>,
}

struct Inner {
    cm: Arc<Shared>,
    st: Mutex<State>,
    channel: Mutex<EventChannel>,
    qp: Mutex<Option<Arc<dyn CmQp>>>,
    user: AtomicUsize,
}

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl Eq for CmId {}

impl std::hash::Hash for CmId {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        Arc::as_ptr(&self.inner).hash(h);
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("CmId")
            .field("phase", &st.phase)
            .field("src", &st.src)
            .field("dst", &st.dst)
            .finish_non_exhaustive()
    }
}

/// Where an id is bound and what it resolved (`rdma_cm_id.route`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Route {
    /// The local address and port.
    pub src: Option<SocketAddr>,
    /// The peer's address and port.
    pub dst: Option<SocketAddr>,
    /// The device (index in the [`RdmaCm`](super::RdmaCm)), once known.
    pub device: Option<usize>,
    /// The device's GID (zero before).
    pub sgid: [u8; 16],
    /// The peer's GID (zero before it is resolved).
    pub dgid: [u8; 16],
    /// `sgid`'s index in the device's GID table.
    pub sgid_index: u8,
    /// The device's active MTU.
    pub mtu: Option<Mtu>,
}

impl CmId {
    pub(super) fn new(
        cm: &Arc<Shared>,
        channel: &EventChannel,
        ps: PortSpace,
        qp_type: QpType,
    ) -> CmId {
        CmId {
            inner: Arc::new(Inner {
                cm: Arc::clone(cm),
                st: Mutex::new(State {
                    phase: Phase::Idle,
                    ps,
                    qp_type,
                    dev: None,
                    sgid_index: 0,
                    src: None,
                    dst: None,
                    port_held: None,
                    conn: None,
                    peer: None,
                    neg: Negotiated::default(),
                    ack_timeout: None,
                    local_ece: None,
                    remote_ece: crate::Ece::default(),
                }),
                channel: Mutex::new(channel.clone()),
                qp: Mutex::new(None),
                user: AtomicUsize::new(0),
            }),
        }
    }

    /// A child of `listener` for a request from the peer in `hdr`: its
    /// channel, port space and QP type, on device `d`.
    pub(super) fn child(
        listener: &CmId,
        d: &Device,
        conn: ConnId,
        hdr: &CmaHeader,
        port: u16,
    ) -> CmId {
        let (ps, qp_type) = {
            let st = listener.lock();
            (st.ps, st.qp_type)
        };
        let child = CmId::new(&listener.inner.cm, &listener.channel(), ps, qp_type);
        {
            let mut st = child.lock();
            st.src = Some(SocketAddr::new(hdr.dst, port));
            st.dst = Some(hdr.src);
            st.peer = Some(hdr.src.ip());
            st.conn = Some(conn);
            st.phase = Phase::RequestRcvd;
            st.on_device(d);
        }
        listener.inner.cm.register_conn(d.index, conn, &child);
        child
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn cm(&self) -> &Arc<Shared> {
        &self.inner.cm
    }

    /// The channel its events go to.
    pub fn channel(&self) -> EventChannel {
        self.inner
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues an event on the id's channel.
    pub(super) fn post(
        &self,
        kind: CmEventKind,
        status: i32,
        listen_id: Option<CmId>,
        param: EventParam,
    ) {
        self.channel().post(CmEvent {
            kind,
            status,
            id: self.clone(),
            listen_id,
            param,
        });
    }

    /// The QP attached to it.
    pub fn qp(&self) -> Option<Arc<dyn CmQp>> {
        self.inner
            .qp
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Attaches `qp` (or detaches) without moving it: the C drop-in's
    /// `rdma_cm_id.qp`, set by an application itself.
    pub fn set_qp(&self, qp: Option<Arc<dyn CmQp>>) {
        *self.inner.qp.lock().unwrap_or_else(|e| e.into_inner()) = qp;
    }

    /// Moves `qp` to INIT (a UD QP on to RTS: it needs no peer) with the
    /// id's values and attaches it, as `rdma_create_qp` does.
    pub fn attach_qp(&self, qp: Arc<dyn CmQp>) -> io::Result<()> {
        let steps: Vec<CmQpAttr> = {
            let st = self.lock();
            let plan = st.plan(qp.qp_type());
            let mut steps = vec![attr_for(&plan, QpState::Init)?];
            if qp.qp_type() == QpType::Ud {
                steps.push(attr_for(&plan, QpState::Rtr)?);
                steps.push(attr_for(&plan, QpState::Rts)?);
            }
            steps
        };
        qp.modify(&steps)?;
        self.set_qp(Some(qp));
        Ok(())
    }

    /// `rdma_create_qp` for Rust callers: a QP on the id's device, moved to
    /// INIT and attached (EINVAL before the id is on a device).
    pub fn create_qp(
        &self,
        init: &QpInit,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> io::Result<QueuePair> {
        let ctx = self.context().ok_or_else(|| errno(libc::EINVAL))?;
        let qp = ctx
            .create_qp_with(init, send_cq.id(), recv_cq.id())
            .map_err(|e| errno(e.errno()))?;
        self.attach_qp(Arc::new(qp.clone()))?;
        Ok(qp)
    }

    /// The context of the id's device, once bound to one or resolved.
    pub fn context(&self) -> Option<crate::engine::Context> {
        let dev = self.lock().dev?;
        self.cm().device(dev).ok().map(|d| d.ctx.clone())
    }

    /// `rdma_init_qp_attr`: what the id's QP takes to reach `state` (INIT,
    /// RTR or RTS; EINVAL for RTR before a peer is known).
    pub fn qp_attr(&self, state: QpState) -> io::Result<CmQpAttr> {
        let st = self.lock();
        attr_for(&st.plan(st.qp_type), state)
    }

    /// Its port space.
    pub fn port_space(&self) -> PortSpace {
        self.lock().ps
    }

    /// The QP type it sets up.
    pub fn qp_type(&self) -> QpType {
        self.lock().qp_type
    }

    /// Its addresses, device and GIDs.
    pub fn route(&self) -> Route {
        let st = self.lock();
        let mut r = Route {
            src: st.src,
            dst: st.dst,
            device: st.dev,
            sgid_index: st.sgid_index,
            dgid: st.peer.map(gid_of).unwrap_or_default(),
            ..Route::default()
        };
        let dev = st.dev;
        drop(st);
        if let Some(d) = dev.and_then(|i| self.cm().device(i).ok()) {
            r.sgid = d.gid;
            r.mtu = Mtu::from_ibv_mtu(d.mtu);
        }
        r
    }

    /// A word for the layer above (the C drop-in keeps its `rdma_cm_id`
    /// here); 0 until set.
    pub fn user_data(&self) -> usize {
        self.inner.user.load(Ordering::Acquire)
    }

    /// Sets [`user_data`](Self::user_data).
    pub fn set_user_data(&self, v: usize) {
        self.inner.user.store(v, Ordering::Release);
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the QP's local ACK
    /// timeout exponent (4.096 us * 2^t).
    pub fn set_ack_timeout(&self, t: u8) {
        self.lock().ack_timeout = Some(t.min(31));
    }

    /// `rdma_bind_addr`: an address of a burst device (or the wildcard)
    /// and a port (0: an ephemeral one). A loopback address that is no
    /// device's own binds as the kernel's CM binds it: to no device yet
    /// (`verbs` stays NULL; a listen on it hears this host, a connection
    /// from it goes through the first device). libfabric's verbs provider
    /// relies on that to tell a device's real addresses from loopback.
    pub fn bind_addr(&self, a: SocketAddr) -> io::Result<()> {
        let cm = self.cm();
        let mut st = self.lock();
        if st.phase != Phase::Idle {
            return Err(errno(libc::EINVAL));
        }
        let dev = if a.ip().is_unspecified() {
            None
        } else {
            match addr::own_device(&cm.addrs, a.ip()) {
                Some(d) => Some(d),
                None if addr::is_loopback(a.ip()) && !cm.addrs.is_empty() => None,
                None => {
                    // Info: libfabric binds each interface address to
                    // learn which ones have a device.
                    tracing::info!(addr = %a.ip(), "rdma_bind_addr: not an address of a burst device");
                    return Err(errno(libc::EADDRNOTAVAIL));
                }
            }
        };
        let port = cm.take_port(st.ps, a.port())?;
        if let Some(dev) = dev {
            match cm.device(dev) {
                Ok(d) => st.on_device(&d),
                Err(e) => {
                    cm.release_port(st.ps, port);
                    return Err(e);
                }
            }
        }
        st.port_held = Some(port);
        st.src = Some(SocketAddr::new(a.ip(), port));
        st.phase = Phase::Bound;
        Ok(())
    }

    /// `rdma_listen`: requests for the bound address and port (all
    /// devices for the wildcard; an unbound id takes an ephemeral port)
    /// arrive as [`CmEventKind::ConnectRequest`] with a new id.
    pub fn listen(&self) -> io::Result<()> {
        let cm = self.cm();
        let (svc, devs) = {
            let mut st = self.lock();
            if st.phase == Phase::Idle {
                let p = cm.take_port(st.ps, 0)?;
                st.port_held = Some(p);
                st.src = Some(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), p));
            } else if st.phase != Phase::Bound {
                return Err(errno(libc::EINVAL));
            }
            let Some(src) = st.src else {
                return Err(errno(libc::EINVAL));
            };
            st.phase = Phase::Listening;
            (
                st.ps.service_id(src.port()),
                addr::devices_for(&cm.addrs, Some(src.ip())),
            )
        };
        if devs.is_empty() {
            self.lock().phase = Phase::Bound;
            return Err(errno(libc::ENODEV));
        }
        // Registered before the device's CM takes requests for the
        // service: a REQ that came in between found no listener here and
        // was rejected (INVALID_SERVICE_ID) although the listen succeeded
        // (two forked processes on one burstd, 2 connects in 10).
        cm.with_reg(|r| r.listeners.push(self.clone()));
        for dev in devs {
            // Several listeners (other addresses) may share a service ID.
            if let Err(e) = cm.device_listening(dev, Some(svc)) {
                tracing::warn!("rdma_listen: {e}");
                cm.with_reg(|r| r.listeners.retain(|l| l != self));
                self.lock().phase = Phase::Bound;
                return Err(match e.raw_os_error() {
                    Some(_) => e,
                    None if e.kind() == io::ErrorKind::AddrInUse => errno(libc::EADDRINUSE),
                    None => errno(libc::EIO),
                });
            }
        }
        Ok(())
    }

    fn unlisten(&self) {
        let cm = self.cm();
        let services: Vec<(usize, u64)> = {
            let st = self.lock();
            let Some(src) = st.src else { return };
            let svc = st.ps.service_id(src.port());
            addr::devices_for(&cm.addrs, Some(src.ip()))
                .into_iter()
                .map(|d| (d, svc))
                .collect()
        };
        // The service stays listened to while another listener holds it.
        let last = cm.with_reg(|r| {
            r.listeners.retain(|l| l != self);
            services
                .iter()
                .filter(|(_, svc)| {
                    !r.listeners.iter().any(|l| {
                        let st = l.lock();
                        st.src.is_some_and(|s| st.ps.service_id(s.port()) == *svc)
                    })
                })
                .copied()
                .collect::<Vec<_>>()
        });
        for (dev, svc) in last {
            if let Ok(d) = cm.device(dev) {
                d.svc.unlisten(svc);
            }
        }
    }

    /// `rdma_resolve_addr`: finds the device towards `dst` (from `src`'s
    /// if given) and posts [`CmEventKind::AddrResolved`], or
    /// [`CmEventKind::AddrError`] when no device reaches it.
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> io::Result<()> {
        let cm = self.cm();
        {
            let mut st = self.lock();
            if !matches!(st.phase, Phase::Idle | Phase::Bound) {
                return Err(errno(libc::EINVAL));
            }
            let src_ip = st
                .src
                .map(|s| s.ip())
                .filter(|ip| !ip.is_unspecified())
                .or_else(|| src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified()));
            let Some((dev, local_ip, peer)) = addr::resolve(&cm.addrs, src_ip, dst.ip()) else {
                drop(st);
                self.post(
                    CmEventKind::AddrError,
                    -libc::ENETUNREACH,
                    None,
                    EventParam::None,
                );
                return Ok(());
            };
            let d = cm.device(dev)?;
            if st.port_held.is_none() {
                st.port_held = Some(cm.take_port(st.ps, src.map_or(0, |s| s.port()))?);
            }
            let port = st.port_held.unwrap_or(0);
            st.src = Some(SocketAddr::new(local_ip, port));
            st.dst = Some(dst);
            st.peer = Some(peer);
            st.phase = Phase::AddrResolved;
            st.on_device(&d);
        }
        self.post(CmEventKind::AddrResolved, 0, None, EventParam::None);
        Ok(())
    }

    /// `rdma_join_multicast` on RoCE: the group's GID is its IP address
    /// (IPv4-mapped for IPv4), so the join completes at once with a
    /// [`CmEventKind::MulticastJoin`] carrying the group's address vector
    /// (hop limit 1, IP's default multicast TTL), QPN 0xFFFFFF and the
    /// port space's Q_Key (`RDMA_UDP_QKEY` for UDP), as the kernel's CM
    /// reports it; returns the group's GID, which the caller attaches its
    /// UD QP to (librdmacm attaches `id->qp` when the event arrives). The
    /// id must have a device (bound to a device's address, or resolved)
    /// and the address must be a multicast one (EINVAL otherwise); its port
    /// space must be a datagram one (ENOSYS otherwise, as for RC ids).
    pub fn join_multicast(&self, group: SocketAddr) -> io::Result<[u8; 16]> {
        let mgid = match group.ip() {
            IpAddr::V4(v4) if v4.is_multicast() => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) if v6.is_multicast() => v6.octets(),
            _ => return Err(errno(libc::EINVAL)),
        };
        let (sgid_index, qkey) = {
            let st = self.lock();
            if st.dev.is_none() {
                return Err(errno(libc::EINVAL));
            }
            if !st.ps.is_datagram() {
                return Err(errno(libc::ENOSYS));
            }
            (st.sgid_index, burst_cm::rdma::RDMA_UDP_QKEY)
        };
        self.post(
            CmEventKind::MulticastJoin,
            0,
            None,
            EventParam::Ud(UdParam {
                private_data: Vec::new(),
                av: AddressVector {
                    dgid: mgid,
                    sgid_index,
                    hop_limit: 1,
                },
                qp_num: 0xff_ffff,
                qkey,
            }),
        );
        Ok(mgid)
    }

    /// `rdma_resolve_route`: posts [`CmEventKind::RouteResolved`] (RoCE
    /// has one path: the resolved address's).
    pub fn resolve_route(&self) -> io::Result<()> {
        {
            let mut st = self.lock();
            if st.phase != Phase::AddrResolved {
                return Err(errno(libc::EINVAL));
            }
            st.phase = Phase::RouteResolved;
        }
        self.post(CmEventKind::RouteResolved, 0, None, EventParam::None);
        Ok(())
    }

    /// `rdma_migrate_id`: its events (queued ones too) go to `to`.
    pub fn migrate(&self, to: &EventChannel) {
        let from = std::mem::replace(
            &mut *self.inner.channel.lock().unwrap_or_else(|e| e.into_inner()),
            to.clone(),
        );
        from.move_events(self, to);
    }

    /// `rdma_destroy_id`: releases its connection, listen and port; its
    /// queued events are dropped. Calls on it fail with EINVAL after.
    pub fn destroy(&self) {
        let cm = self.cm();
        let (dev, conn, ps, port, listening) = {
            let mut st = self.lock();
            if st.phase == Phase::Destroyed {
                return;
            }
            let v = (
                st.dev,
                st.conn.take(),
                st.ps,
                st.port_held.take(),
                st.phase == Phase::Listening,
            );
            st.phase = Phase::Destroyed;
            v
        };
        if let (Some(dev), Some(conn)) = (dev, conn) {
            cm.unregister_conn(dev, conn);
            if let Ok(d) = cm.device(dev) {
                d.svc.with(|c, now| c.release(now, conn));
            }
        }
        if listening {
            self.unlisten();
        }
        if let Some(port) = port {
            cm.release_port(ps, port);
        }
        self.set_qp(None);
        self.channel().discard(self);
    }

    /// Moves the QP through INIT (again, for the access flags), RTR and
    /// RTS with the agreed values, in one trip to the engine.
    pub(super) fn ready_qp(&self, st: &State) -> io::Result<()> {
        let Some(qp) = self.qp() else { return Ok(()) };
        let plan = st.plan(qp.qp_type());
        let steps = [QpState::Init, QpState::Rtr, QpState::Rts]
            .into_iter()
            .map(|s| attr_for(&plan, s))
            .collect::<io::Result<Vec<_>>>()?;
        qp.modify(&steps)
    }

    /// `rdma_set_local_ece`: the ECE this id's REQ or REP carries, for an
    /// application that readies its own QP (`ibv_query_ece` on it, then
    /// this). EINVAL when the id has a QP (the library takes that QP's
    /// ECE) and for vendor ID 0.
    pub fn set_local_ece(&self, ece: crate::Ece) -> io::Result<()> {
        if self.qp().is_some() || ece.vendor_id == 0 {
            return Err(errno(libc::EINVAL));
        }
        self.lock().local_ece = Some(ece);
        Ok(())
    }

    /// `rdma_get_remote_ece`: the ECE the peer's REQ (passive side) or REP
    /// (active side) carried; vendor ID 0 when it carried none (the
    /// kernel's CM with RXE) or none arrived yet. EINVAL when the id has a
    /// QP (the library set it on that QP already).
    pub fn remote_ece(&self) -> io::Result<crate::Ece> {
        if self.qp().is_some() {
            return Err(errno(libc::EINVAL));
        }
        Ok(self.lock().remote_ece)
    }

    /// The passive QP of a connection set up fast may send: the active
    /// side's RTU says its QP receives. (A QP in another state by now,
    /// ERROR after a disconnect, refuses; nothing to do then.)
    pub(super) fn peer_ready(&self) {
        if let Some(qp) = self.qp() {
            let a = CmQpAttr {
                attr: crate::QpAttr {
                    state: Some(QpState::Rts),
                    wait_for_peer: Some(false),
                    ..Default::default()
                },
                av: None,
            };
            let _ = qp.modify(&[a]);
        }
    }

    /// The QP to ERROR (its work requests flush).
    pub(super) fn qp_to_error(&self) {
        if let Some(qp) = self.qp() {
            let a = CmQpAttr {
                attr: crate::QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                },
                av: None,
            };
            let _ = qp.modify(&[a]);
        }
    }
}
