//! Sessions set up through rdma_cm: one connection per QP, the pools'
//! address, length and rkey in the CM's private data, so the peer needs
//! nothing but an IP address and a port (and may be any rdma_cm user that
//! speaks this private data).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use burst_verbs::engine::QueuePair;
use burst_verbs::rdma_cm::{
    CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventParam, PortSpace, RdmaCm,
};

use crate::rdma::{Endpoint, Parts};
use crate::{Pool, RdmaSession, SessionOptions, XferError};

/// Private data: pool address, length, rkey, this QP's index, QP count.
const PRIVATE: usize = 8 + 8 + 4 + 2 + 2;

fn private(pool: &Pool, index: usize, qps: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(PRIVATE);
    b.extend_from_slice(&pool.addr().to_le_bytes());
    b.extend_from_slice(&(pool.len() as u64).to_le_bytes());
    b.extend_from_slice(&pool.keys().map_or(0, |k| k.rkey).to_le_bytes());
    b.extend_from_slice(&(index as u16).to_le_bytes());
    b.extend_from_slice(&(qps as u16).to_le_bytes());
    b
}

/// (pool address, length, rkey, index, count) from a peer's private data.
fn parse(p: &[u8]) -> Option<(u64, u64, u32, usize, usize)> {
    let at = |o: usize, n: usize| p.get(o..o + n);
    Some((
        u64::from_le_bytes(at(0, 8)?.try_into().ok()?),
        u64::from_le_bytes(at(8, 8)?.try_into().ok()?),
        u32::from_le_bytes(at(16, 4)?.try_into().ok()?),
        u16::from_le_bytes(at(20, 2)?.try_into().ok()?) as usize,
        u16::from_le_bytes(at(22, 2)?.try_into().ok()?) as usize,
    ))
}

fn cm_err(what: &'static str) -> impl Fn(std::io::Error) -> XferError {
    move |e| XferError::Setup(format!("rdma_cm {what}: {e}"))
}

/// The next event within `t` (the channel's descriptor polled).
fn next(ch: &EventChannel, t: Duration) -> Result<CmEvent, XferError> {
    use std::os::fd::{AsFd, AsRawFd};
    let mut p = libc::pollfd {
        fd: ch.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one live pollfd for the call.
    if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
        return Err(XferError::Timeout(t));
    }
    ch.get_event().map_err(cm_err("event"))
}

fn expect(ch: &EventChannel, kind: CmEventKind, t: Duration) -> Result<CmEvent, XferError> {
    let e = next(ch, t)?;
    if e.kind != kind {
        return Err(XferError::Setup(format!(
            "rdma_cm: {:?} (status {}) where {kind:?} was due",
            e.kind, e.status
        )));
    }
    Ok(e)
}

fn conn_param(pool: &Pool, index: usize, qps: usize) -> ConnParam {
    ConnParam {
        private_data: private(pool, index, qps),
        responder_resources: 16,
        initiator_depth: 16,
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// Resolves `id`'s address and route towards `peer`.
fn resolve(
    id: &CmId,
    ch: &EventChannel,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<(), XferError> {
    id.resolve_addr(None, peer)
        .map_err(cm_err("resolve_addr"))?;
    expect(ch, CmEventKind::AddrResolved, timeout)?;
    id.resolve_route().map_err(cm_err("resolve_route"))?;
    expect(ch, CmEventKind::RouteResolved, timeout)?;
    Ok(())
}

/// The peer's pool from its private data, as the session's peer.
fn peer_endpoint((addr, len, rkey): (u64, u64, u32)) -> Endpoint {
    Endpoint {
        gid: [0; 16],
        qps: Vec::new(),
        addr,
        len,
        rkey,
    }
}

impl RdmaSession {
    /// Connects to a peer that [`RdmaSession::accept_cm`]s at `peer`: one
    /// rdma_cm connection per QP on `cm`'s device towards it (`pool`
    /// registered on that device's context).
    pub fn connect_cm(
        cm: &RdmaCm,
        pool: Arc<Pool>,
        o: &SessionOptions,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<RdmaSession, XferError> {
        let ch = EventChannel::new().map_err(cm_err("channel"))?;
        let mut parts: Option<Parts> = None;
        let mut remote = None;
        for i in 0..o.qps {
            let id = cm.create_id(&ch, PortSpace::Tcp);
            let resolved = resolve(&id, &ch, peer, timeout);
            // The first connection decides the device the session is on.
            let made = match (&parts, resolved) {
                (_, Err(e)) => Err(e),
                (Some(_), Ok(())) => Ok(()),
                (None, Ok(())) => id
                    .context()
                    .ok_or(XferError::Setup("rdma_cm: no device".into()))
                    .and_then(|ctx| Parts::new(&ctx, &pool, o))
                    .map(|mut p| {
                        p.cm = Some((ch.clone(), Vec::with_capacity(o.qps)));
                        parts = Some(p);
                    }),
            };
            if let Err(e) = made {
                id.destroy();
                return Err(e);
            }
            let Some(p) = parts.as_mut() else {
                return Err(XferError::Setup("no QPs".into()));
            };
            // Kept, and destroyed with the rest on failure, from here on.
            if let Some((_, ids)) = p.cm.as_mut() {
                ids.push(id.clone());
            }
            let qp = id
                .create_qp(&p.init, &p.scq, &p.rcq)
                .map_err(cm_err("create_qp"))?;
            p.qps.push(qp);
            id.connect(Some(&conn_param(&pool, i, o.qps)))
                .map_err(cm_err("connect"))?;
            let e = next(&ch, timeout)?;
            if e.kind != CmEventKind::Established {
                return Err(XferError::Setup(format!(
                    "rdma_cm: connection {i}: {:?} (status {})",
                    e.kind, e.status
                )));
            }
            if let EventParam::Conn(c) = &e.param {
                remote = parse(&c.private_data).map(|(a, l, k, _, _)| (a, l, k));
            }
        }
        let remote = remote.ok_or(XferError::Setup("rdma_cm: the peer sent no pool".into()))?;
        let parts = parts.ok_or(XferError::Setup("no QPs".into()))?;
        parts.finish(pool, peer_endpoint(remote))
    }

    /// Takes one [`RdmaSession::connect_cm`] at `listen`: waits for its
    /// connections (all of them, in any order) and accepts each with this
    /// side's pool.
    pub fn accept_cm(
        cm: &RdmaCm,
        pool: Arc<Pool>,
        o: &SessionOptions,
        listen: SocketAddr,
        timeout: Duration,
    ) -> Result<RdmaSession, XferError> {
        let ch = EventChannel::new().map_err(cm_err("channel"))?;
        let listener = cm.create_id(&ch, PortSpace::Tcp);
        let r = accept_on(&ch, &listener, pool, o, listen, timeout);
        listener.destroy();
        r
    }
}

fn accept_on(
    ch: &EventChannel,
    listener: &CmId,
    pool: Arc<Pool>,
    o: &SessionOptions,
    listen: SocketAddr,
    timeout: Duration,
) -> Result<RdmaSession, XferError> {
    listener.bind_addr(listen).map_err(cm_err("bind"))?;
    listener.listen().map_err(cm_err("listen"))?;
    let mut parts: Option<Parts> = None;
    // Each connection's QP and id by its index (the lanes' order).
    let mut by_index: Vec<Option<(QueuePair, CmId)>> = (0..o.qps).map(|_| None).collect();
    let mut remote = None;
    let mut established = 0;
    let result = loop {
        if established == o.qps {
            break Ok(());
        }
        let e = match next(ch, timeout) {
            Ok(e) => e,
            Err(e) => break Err(e),
        };
        match e.kind {
            CmEventKind::ConnectRequest => {
                let info = match &e.param {
                    EventParam::Conn(c) => parse(&c.private_data),
                    _ => None,
                };
                // One connection per index, of the number this side has.
                let fits = |x: &(u64, u64, u32, usize, usize)| {
                    x.3 < o.qps && x.4 == o.qps && by_index[x.3].is_none()
                };
                let Some((addr, len, rkey, i, n)) = info.filter(fits) else {
                    let _ = e.id.reject(b"burst-xfer: not a session of this shape");
                    e.id.destroy();
                    continue;
                };
                remote = Some((addr, len, rkey));
                if parts.is_none() {
                    // The first request decides the device the session is on.
                    let made =
                        e.id.context()
                            .ok_or(XferError::Setup("rdma_cm: no device".into()))
                            .and_then(|ctx| Parts::new(&ctx, &pool, o));
                    match made {
                        Ok(p) => parts = Some(p),
                        Err(err) => {
                            e.id.destroy();
                            break Err(err);
                        }
                    }
                }
                let Some(p) = parts.as_ref() else { continue };
                let qp = match e.id.create_qp(&p.init, &p.scq, &p.rcq) {
                    Ok(qp) => qp,
                    Err(err) => break Err(cm_err("create_qp")(err)),
                };
                by_index[i] = Some((qp, e.id.clone()));
                if let Err(err) = e.id.accept(Some(&conn_param(&pool, i, n))) {
                    break Err(cm_err("accept")(err));
                }
            }
            CmEventKind::Established => established += 1,
            k => {
                break Err(XferError::Setup(format!(
                    "rdma_cm: {k:?} (status {}) while accepting",
                    e.status
                )))
            }
        }
    };
    // Into the parts, in lane order: destroyed with them on failure.
    let Some(mut parts) = parts else {
        return result.and(Err(XferError::Setup("no QPs".into())));
    };
    let mut ids = Vec::with_capacity(o.qps);
    for (qp, id) in by_index.into_iter().flatten() {
        parts.qps.push(qp);
        ids.push(id);
    }
    parts.cm = Some((ch.clone(), ids));
    result?;
    let remote = remote.ok_or(XferError::Setup("no peer".into()))?;
    parts.finish(pool, peer_endpoint(remote))
}
