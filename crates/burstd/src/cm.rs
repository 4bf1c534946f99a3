//! QP1 for many applications: burstd owns the device's QP1 and each client
//! runs its own connection manager (burst-cm in its library). The router
//! hands every MAD that arrives to the client it is for: REQs and SIDR_REQs
//! by service ID to the client listening on it, the other messages by the
//! communication ID they name, which belongs to the client that sent the
//! message carrying it. A client may only speak for its own IDs. What no
//! client owns is answered by burstd's own CM, per the spec (a REJ for a
//! REQ nobody listens for, a DREP for an unknown DREQ), or dropped.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_cm::{Cm, CmConfig};
use burst_verbs::engine::Context;
use burst_verbs::eventfd::EventFd;
use burst_verbs::gsi::{Gsi, GsiMad};
use burst_verbs::protocol::{self as p, MadRecv};
use burst_wire::mad::{CmAttr, CmDreq, CmMad, CmMessage, MAD_HEADER_LEN, MAD_LEN, MGMT_CLASS_CM};
use burst_wire::Qpn;
use std::net::IpAddr;

/// Communication IDs a client may hold at once (time-wait included).
const MAX_IDS_PER_CLIENT: usize = 65536;

/// REQs routed to listeners whose requester's QPN is remembered until the
/// listener's REP (see [`Table::req_qpns`]); past this the memory is
/// cleared, and connections accepted before that are not disconnected
/// for a client that dies.
const MAX_PENDING_REQS: usize = 65536;

/// What the router learned of a client's connection from the MADs it
/// carried: enough to send the DREQ the client's CM would have sent had
/// it ended its connections before it went ([`Router::detach`]).
struct Link {
    client: u32,
    peer: IpAddr,
    /// The peer's communication ID and QPN, once a REP crossed.
    remote: Option<(u32, Qpn)>,
}

/// How many times burstd sends the DREQ of a departed client's
/// connection when no answer comes: the first, then after 100, 200 and
/// 400 ms (a lost DREQ would else leave the peer to its retries).
const FAREWELL_SENDS: u32 = 4;

/// The wait after a departed client's first DREQ; doubled after each.
const FAREWELL_WAIT: Duration = Duration::from_millis(100);

/// DREQs of departed clients waiting for an answer at once; past this a
/// DREQ is sent once only.
const MAX_FAREWELLS: usize = 65536;

/// The DREQs burstd sends for the connections departed clients left up
/// ([`Router::detach`]), sent again until the peer answers (a DREP, or its
/// own DREQ or REJ) or [`FAREWELL_SENDS`] went, as a CM repeats its own.
#[derive(Default)]
struct Farewells {
    /// By the departed client's communication ID.
    pending: HashMap<u32, Farewell>,
    /// No DREQ is due before this (a lower bound: answers do not raise
    /// it), so the router's loop walks `pending` only when one may be.
    earliest: Option<Instant>,
}

struct Farewell {
    peer: IpAddr,
    mad: [u8; MAD_LEN],
    sent: u32,
    due: Instant,
}

impl Farewells {
    /// A DREQ for ID `id` to `peer` was sent at `now`: send it again at
    /// its times unless answered. Whether it is followed (false: the
    /// table is full).
    fn add(&mut self, id: u32, peer: IpAddr, mad: [u8; MAD_LEN], now: Instant) -> bool {
        if self.pending.len() >= MAX_FAREWELLS {
            return false;
        }
        let due = now + FAREWELL_WAIT;
        let f = Farewell {
            peer,
            mad,
            sent: 1,
            due,
        };
        self.pending.insert(id, f);
        self.earliest = Some(self.earliest.map_or(due, |e| e.min(due)));
        true
    }

    /// A REJ, DREQ or DREP from `peer` naming `id` as the receiver's: the
    /// DREQ was answered (from anyone else, it was not).
    fn answered(&mut self, id: u32, peer: IpAddr) {
        if self.pending.get(&id).is_some_and(|f| f.peer == peer) {
            self.pending.remove(&id);
        }
    }

    /// `id` belongs to a client again: its old DREQ stops.
    fn forget(&mut self, id: u32) {
        self.pending.remove(&id);
    }

    /// The DREQs to send again at `now`; those sent [`FAREWELL_SENDS`]
    /// times are dropped.
    fn due(&mut self, now: Instant) -> Vec<GsiMad> {
        let mut out = Vec::new();
        if self.earliest.is_none_or(|e| e > now) {
            return out;
        }
        let mut earliest: Option<Instant> = None;
        self.pending.retain(|_, f| {
            if f.due <= now {
                if f.sent >= FAREWELL_SENDS {
                    return false;
                }
                out.push(GsiMad {
                    peer: f.peer,
                    mad: f.mad,
                });
                f.due = now + FAREWELL_WAIT * (1 << f.sent);
                f.sent += 1;
            }
            earliest = Some(earliest.map_or(f.due, |e| e.min(f.due)));
            true
        });
        self.earliest = earliest;
        out
    }

    /// When the next DREQ may be due, if any.
    fn next_due(&self) -> Option<Instant> {
        self.earliest
    }
}

#[derive(Default)]
struct Table {
    sockets: HashMap<u32, OwnedFd>,
    listeners: HashMap<u64, u32>,
    /// Communication (or SIDR request) ID → client.
    ids: HashMap<u32, u32>,
    /// How many IDs each client holds.
    held: HashMap<u32, usize>,
    /// Connections by the client's communication ID (at most one per ID
    /// in `ids`, so bounded as they are).
    links: HashMap<u32, Link>,
    /// The requester's QPN of each REQ routed to a listener, by (peer,
    /// the peer's communication ID), until the listener's REP.
    req_qpns: HashMap<(IpAddr, u32), Qpn>,
    /// DREQs of departed clients, until answered.
    farewells: Farewells,
    dropped: u64,
}

/// The router (see the module documentation).
pub struct Router {
    ctx: Context,
    gsi: Arc<Gsi>,
    table: Mutex<Table>,
    /// The CM that answers what no client owns.
    strays: Mutex<Cm>,
    /// Signalled when the set of sockets changes.
    wake: EventFd,
    start: Instant,
}

/// The attribute ID of a MAD, if it is a CM one.
fn cm_attr(mad: &[u8]) -> Option<u16> {
    (mad.len() >= MAD_HEADER_LEN + 16 && mad[1] == MGMT_CLASS_CM)
        .then(|| u16::from_be_bytes([mad[16], mad[17]]))
}

fn u32_at(mad: &[u8], body: usize) -> u32 {
    let at = MAD_HEADER_LEN + body;
    u32::from_be_bytes([mad[at], mad[at + 1], mad[at + 2], mad[at + 3]])
}

fn u64_at(mad: &[u8], body: usize) -> u64 {
    let at = MAD_HEADER_LEN + body;
    let mut b = [0u8; 8];
    b.copy_from_slice(&mad[at..at + 8]);
    u64::from_be_bytes(b)
}

const REQ: u16 = CmAttr::Req as u16;
const SIDR_REQ: u16 = CmAttr::SidrReq as u16;
const SIDR_REP: u16 = CmAttr::SidrRep as u16;

impl Router {
    /// The router of `ctx`'s device; `None` for a context without QP1.
    pub fn new(ctx: &Context) -> std::io::Result<Option<Arc<Router>>> {
        let Some(gsi) = ctx.gsi().cloned() else {
            return Ok(None);
        };
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        let guid = ctx.query_device().node_guid;
        Ok(Some(Arc::new(Router {
            ctx: ctx.clone(),
            gsi,
            table: Mutex::default(),
            strays: Mutex::new(Cm::new(CmConfig::new(guid, u64::from_ne_bytes(seed)))),
            wake: EventFd::new()?,
            start: Instant::now(),
        })))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Client `client`'s MAD socket (it replaces an earlier one).
    pub fn attach(&self, client: u32, sock: OwnedFd) {
        self.table().sockets.insert(client, sock);
        self.wake.signal();
    }

    /// Routes requests for `service_id` to `client` (or stops); `false`
    /// when another client listens on it.
    pub fn listen(&self, client: u32, service_id: u64, on: bool) -> bool {
        let mut t = self.table();
        match (t.listeners.get(&service_id).copied(), on) {
            (Some(c), true) if c != client => false,
            (_, true) => {
                t.listeners.insert(service_id, client);
                true
            }
            (Some(c), false) if c == client => {
                t.listeners.remove(&service_id);
                drop(t);
                // A listener closed and reopened (perftest -R) is not
                // refused in between: burstd's CM holds the REQs a moment.
                let mut cm = self.strays.lock().unwrap_or_else(|e| e.into_inner());
                cm.handle_timeout(self.now());
                cm.unlisten(service_id);
                true
            }
            (_, false) => true,
        }
    }

    /// A client is gone: its socket, listens and IDs go.
    pub fn detach(&self, client: u32) {
        let sock = self.table().sockets.remove(&client);
        // What it sent before it went still leaves, as the kernel's CM
        // sends what an exiting process sent: a server that accepts and
        // exits at once (its REP not read yet) left its peer to send the
        // REQ again, to no listener, and be rejected. Bounded: QP1's
        // queue refuses past its depth anyway.
        if let Some(s) = sock {
            for _ in 0..1024 {
                match p::recv_mad(s.as_fd()) {
                    MadRecv::Mad(m) => self.depart(client, m),
                    MadRecv::Bad => self.table().dropped += 1,
                    MadRecv::Empty | MadRecv::Closed => break,
                }
            }
        }
        let mut t = self.table();
        t.listeners.retain(|_, c| *c != client);
        t.ids.retain(|_, c| *c != client);
        t.held.remove(&client);
        let mut gone = Vec::new();
        t.links.retain(|&id, l| {
            if l.client != client {
                return true;
            }
            if let Some(remote) = l.remote {
                gone.push((id, l.peer, remote));
            }
            false
        });
        drop(t);
        // Its connections still up are ended, as the kernel's CM sends a
        // DREQ for each connection of a process whose RDMA CM file closes
        // (it exited or was killed): else each peer learns only when its
        // sends run out of retries. Sent again until answered
        // ([`Farewells`]); the peer's DREP finds no owner and burstd's CM
        // drops it.
        let now = Instant::now();
        for (id, peer, (remote_id, remote_qpn)) in gone {
            let dreq = CmDreq {
                local_comm_id: id,
                remote_comm_id: remote_id,
                remote_qpn,
                private_data: [0; 220],
            };
            let mut mad = [0u8; MAD_LEN];
            let tid = u64::from(id) << 32 | u64::from(remote_id);
            if CmMad::new(tid, CmMessage::Dreq(dreq))
                .emit(&mut mad)
                .is_ok()
            {
                tracing::debug!(client, id, %peer, "a departed client's connection: DREQ sent");
                self.ctx.gsi_send(GsiMad { peer, mad });
                self.table().farewells.add(id, peer, mad, now);
            }
        }
        self.wake.signal();
    }

    /// Follows a client's connections through the MADs it sends
    /// (`from_client`) and receives: a REQ or REP it sends opens one, a
    /// REP it receives names the peer's side, a REJ, DREQ or DREP either
    /// way ends it ([`Link`]). `id` is the client's communication ID the
    /// MAD names, checked as the client's own by the caller.
    fn follow(t: &mut Table, client: u32, id: u32, peer: IpAddr, mad: &[u8], from_client: bool) {
        let Ok(m) = CmMad::parse(mad) else {
            return;
        };
        match (m.message, from_client) {
            (CmMessage::Req(_), true) => {
                // A new connection (an ID is used again after time-wait,
                // perhaps towards another peer).
                t.links.insert(
                    id,
                    Link {
                        client,
                        peer,
                        remote: None,
                    },
                );
            }
            (CmMessage::Rep(rep), true) => {
                let qpn = t.req_qpns.remove(&(peer, rep.remote_comm_id));
                // A REP sent again (its RTU late or lost) finds the REQ's
                // QPN taken already: what the first one learned stays,
                // unless the ID now answers another peer's REQ.
                let same = t.links.get(&id).is_some_and(|l| {
                    l.peer == peer && l.remote.is_some_and(|(r, _)| r == rep.remote_comm_id)
                });
                if !same || qpn.is_some() {
                    t.links.insert(
                        id,
                        Link {
                            client,
                            peer,
                            remote: qpn.map(|q| (rep.remote_comm_id, q)),
                        },
                    );
                }
            }
            (CmMessage::Rep(rep), false) => {
                if let Some(l) = t.links.get_mut(&id).filter(|l| l.peer == peer) {
                    l.remote = Some((rep.local_comm_id, rep.local_qpn));
                }
            }
            // From the network, only the connection's own peer ends it (a
            // forged REJ naming a client's ID would else spare it the DREQ).
            (CmMessage::Rej(_) | CmMessage::Dreq(_) | CmMessage::Drep(_), _)
                if from_client || t.links.get(&id).is_some_and(|l| l.peer == peer) =>
            {
                t.links.remove(&id);
            }
            _ => {}
        }
    }

    /// MADs routed nowhere (a full client socket, a client speaking for
    /// another's ID, a stray).
    pub fn dropped(&self) -> u64 {
        self.table().dropped
    }

    /// Which client an arriving MAD is for.
    fn owner(t: &Table, mad: &[u8]) -> Option<u32> {
        match cm_attr(mad)? {
            REQ | SIDR_REQ => t.listeners.get(&u64_at(mad, 8)).copied(),
            SIDR_REP => t.ids.get(&u32_at(mad, 0)).copied(),
            // MRA, REJ, REP, RTU, DREQ, DREP: the receiver's ID second.
            0x11..=0x16 => t.ids.get(&u32_at(mad, 4)).copied(),
            _ => None,
        }
    }

    /// A MAD from the network.
    fn arrive(&self, m: GsiMad) {
        let mut t = self.table();
        // REJ, DREQ, DREP: an answer to a departed client's DREQ?
        if let Some(0x12 | 0x15 | 0x16) = cm_attr(&m.mad) {
            t.farewells.answered(u32_at(&m.mad, 4), m.peer);
        }
        if let Some(c) = Self::owner(&t, &m.mad) {
            match cm_attr(&m.mad) {
                Some(REQ) => {
                    if let Ok(CmMad {
                        message: CmMessage::Req(req),
                        ..
                    }) = CmMad::parse(&m.mad)
                    {
                        if t.req_qpns.len() >= MAX_PENDING_REQS {
                            t.req_qpns.clear();
                        }
                        t.req_qpns
                            .insert((m.peer, req.local_comm_id), req.local_qpn);
                    }
                }
                Some(0x11..=0x16) => {
                    let id = u32_at(&m.mad, 4);
                    Self::follow(&mut t, c, id, m.peer, &m.mad, false);
                }
                _ => {}
            }
            let sent = t
                .sockets
                .get(&c)
                .is_some_and(|s| p::send_mad(s.as_fd(), &m));
            if !sent {
                t.dropped += 1;
            }
            return;
        }
        drop(t);
        // Nobody's: burstd's CM answers per the spec, or counts and drops.
        let mut cm = self.strays.lock().unwrap_or_else(|e| e.into_inner());
        cm.handle_mad(self.now(), m.peer, &m.mad);
        self.flush(&mut cm);
    }

    /// A MAD a client sends: it claims the ID it names as its own.
    fn depart(&self, client: u32, m: GsiMad) {
        let Some(attr) = cm_attr(&m.mad) else {
            self.table().dropped += 1;
            tracing::warn!(client, "a client sent a MAD that is not CM: dropped");
            return;
        };
        let mine = match attr {
            // The sender's own ID comes first.
            REQ | SIDR_REQ | 0x11..=0x16 => Some(u32_at(&m.mad, 0)),
            _ => None,
        };
        if let Some(id) = mine {
            let mut t = self.table();
            match t.ids.get(&id).copied() {
                Some(c) if c != client => {
                    t.dropped += 1;
                    tracing::warn!(
                        client,
                        id,
                        "a client spoke for another's communication ID: dropped"
                    );
                    return;
                }
                Some(_) => {}
                None => {
                    let held = t.held.entry(client).or_default();
                    if *held >= MAX_IDS_PER_CLIENT {
                        t.dropped += 1;
                        return;
                    }
                    *held += 1;
                    t.ids.insert(id, client);
                    t.farewells.forget(id);
                }
            }
            if attr != SIDR_REQ {
                Self::follow(&mut t, client, id, m.peer, &m.mad, true);
            }
        }
        self.ctx.gsi_send(m);
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn flush(&self, cm: &mut Cm) {
        while let Some(t) = cm.poll_transmit() {
            self.ctx.gsi_send(GsiMad {
                peer: t.peer,
                mad: t.mad,
            });
        }
        while cm.poll_event().is_some() {}
    }

    /// The router's thread: QP1 and every client socket, until `stop`.
    pub fn run(&self, stop: &std::sync::atomic::AtomicBool) {
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            while let Some(m) = self.gsi.recv() {
                self.arrive(m);
            }
            let (fds, owners): (Vec<libc::pollfd>, Vec<u32>) = {
                let t = self.table();
                t.sockets
                    .iter()
                    .map(|(c, s)| {
                        (
                            libc::pollfd {
                                fd: s.as_raw_fd(),
                                events: libc::POLLIN,
                                revents: 0,
                            },
                            *c,
                        )
                    })
                    .unzip()
            };
            for &c in &owners {
                loop {
                    let got = {
                        let t = self.table();
                        match t.sockets.get(&c) {
                            Some(s) => p::recv_mad(s.as_fd()),
                            None => MadRecv::Closed,
                        }
                    };
                    match got {
                        MadRecv::Mad(m) => self.depart(c, m),
                        MadRecv::Bad => self.table().dropped += 1,
                        MadRecv::Empty => break,
                        MadRecv::Closed => {
                            // The client's control connection ends it; its
                            // socket just stops being read.
                            self.table().sockets.remove(&c);
                            break;
                        }
                    }
                }
            }
            {
                let mut cm = self.strays.lock().unwrap_or_else(|e| e.into_inner());
                cm.handle_timeout(self.now());
                self.flush(&mut cm);
            }
            let now = Instant::now();
            let (again, next) = {
                let mut t = self.table();
                let again = t.farewells.due(now);
                (again, t.farewells.next_due())
            };
            for m in again {
                self.ctx.gsi_send(m);
            }
            let mut all = fds;
            all.push(libc::pollfd {
                fd: self.gsi.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            all.push(libc::pollfd {
                fd: self.wake.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let wait = next.map_or(Duration::from_millis(200), |d| {
                d.saturating_duration_since(now)
                    .min(Duration::from_millis(200))
            });
            crate::poll_all(&mut all, wait);
            while self.wake.drain() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_cm::rdma::PortSpace;
    use burst_cm::{reason, CmEvent};
    use burst_verbs::cm::CmService;
    use burst_verbs::engine::Engine;
    use burst_verbs::Mtu;
    use burst_wire::mad::{CmIds, CmMad, CmMessage, MAD_LEN};
    use burst_wire::{Psn, Qpn};
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    /// The next MAD on a client's socket, within 5 s.
    fn mad_on(sock: &OwnedFd) -> GsiMad {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            if let MadRecv::Mad(m) = p::recv_mad(sock.as_fd()) {
                return m;
            }
            assert!(Instant::now() < end, "no MAD for the client");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Engines on 127.0.92.`a` and .`a + 1`, and a router on the first.
    fn two_engines(a: u8) -> (IpAddr, Engine, IpAddr, Engine, Arc<Router>) {
        let (ia, ib) = (
            IpAddr::V4(Ipv4Addr::new(127, 0, 92, a)),
            IpAddr::V4(Ipv4Addr::new(127, 0, 92, a + 1)),
        );
        let ea = Engine::start(ia, Mtu::Mtu1024).unwrap();
        let eb = Engine::start(ib, Mtu::Mtu1024).unwrap();
        let router = Router::new(&ea.context()).unwrap().unwrap();
        (ia, ea, ib, eb, router)
    }

    /// A REJ (reason CONSUMER) from communication ID `local` to `remote`.
    fn consumer_rej(local: u32, remote: u32) -> [u8; MAD_LEN] {
        let rej = burst_wire::mad::CmRej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: 0,
            reject_info_length: 0,
            reason: reason::CONSUMER,
            ari: [0; 72],
            private_data: [0; 148],
        };
        let mut mad = [0u8; MAD_LEN];
        CmMad::new(1, CmMessage::Rej(rej)).emit(&mut mad).unwrap();
        mad
    }

    /// A client that answers and exits at once (cm-fork's server accepts
    /// and returns): burstd sends what it wrote before its socket is
    /// dropped, as the kernel's CM sends what an exiting process sent.
    #[test]
    fn what_a_client_sent_before_it_left_still_leaves() {
        // No router thread: nothing reads the client's socket but detach.
        let (ia, _ea, ib, eb, router) = two_engines(3);
        let (c1, d1) = p::mad_socketpair().unwrap();
        router.attach(1, d1);
        let (tb, rb) = mpsc::channel();
        let b = CmService::start(&eb.context(), Box::new(move |e| drop(tb.send(e)))).unwrap();
        let svc = PortSpace::Tcp.service_id(5002);
        let req = burst_cm::req_template(svc, Qpn::new(0x11).unwrap(), Psn::new(1));
        let cb = b.with(|cm, now| cm.connect(now, ia, req)).unwrap();
        let mad = consumer_rej(78, cb.0);
        assert!(p::send_mad(c1.as_fd(), &GsiMad { peer: ib, mad }));
        drop(c1);
        router.detach(1);
        match rb.recv_timeout(Duration::from_secs(5)) {
            Ok(CmEvent::Rejected { conn, rej }) => {
                assert_eq!(conn, cb);
                assert_eq!(rej.reason, reason::CONSUMER);
            }
            e => panic!("the departed client's REJ never left: {e:?}"),
        }
    }

    /// A client killed with a connection up (no DREQ from its CM): burstd
    /// sends the DREQ, as the kernel's CM does when a process's RDMA CM
    /// file closes, so the peer is disconnected at once instead of when
    /// its sends run out of retries. Here the client is the passive side
    /// (its REP names the REQ's QPN, which the router remembered); the
    /// active side is the peer's own CM.
    #[test]
    fn a_client_gone_with_its_connection_up_leaves_a_dreq() {
        let (ia, _ea, ib, eb, router) = two_engines(5);
        let stop = Arc::new(AtomicBool::new(false));
        let (r2, s2) = (Arc::clone(&router), Arc::clone(&stop));
        let thread = std::thread::spawn(move || r2.run(&s2));
        let (c1, d1) = p::mad_socketpair().unwrap();
        router.attach(1, d1);
        let svc = PortSpace::Tcp.service_id(5003);
        assert!(router.listen(1, svc, true));
        // The client's CM, driven by hand over its socket.
        let mut mine = Cm::new(CmConfig::new(1, 2));
        mine.listen(svc).unwrap();
        let pump = |cm: &mut Cm| {
            while let Some(t) = cm.poll_transmit() {
                let m = GsiMad {
                    peer: t.peer,
                    mad: t.mad,
                };
                assert!(p::send_mad(c1.as_fd(), &m));
            }
        };
        let (tb, rb) = mpsc::channel();
        let b = CmService::start(&eb.context(), Box::new(move |e| drop(tb.send(e)))).unwrap();
        let req = burst_cm::req_template(svc, Qpn::new(0x11).unwrap(), Psn::new(1));
        let cb = b.with(|cm, now| cm.connect(now, ia, req)).unwrap();
        let m = mad_on(&c1);
        mine.handle_mad(0, m.peer, &m.mad);
        let Some(CmEvent::Request { conn, .. }) = mine.poll_event() else {
            panic!("no request")
        };
        let rep = burst_cm::rep_template(Qpn::new(0x22).unwrap(), Psn::new(7));
        mine.accept(0, conn, rep).unwrap();
        pump(&mut mine);
        // Its REP again (as when the RTU is late): the router keeps what
        // the first one told it.
        mine.handle_timeout(mine.poll_timeout().expect("the REP waits for its RTU"));
        let again = mine.counters().retransmits;
        pump(&mut mine);
        assert_eq!(again, 1, "the REP was sent again");
        // B readies its QP and sends the RTU: established on both sides.
        match rb.recv_timeout(Duration::from_secs(5)).unwrap() {
            CmEvent::Reply { conn, rep } => {
                assert_eq!((conn, rep.local_qpn), (cb, Qpn::new(0x22).unwrap()));
            }
            e => panic!("{e:?}"),
        }
        b.with(|cm, now| cm.establish(now, cb)).unwrap();
        let m = mad_on(&c1);
        mine.handle_mad(0, m.peer, &m.mad);
        assert!(mine.poll_event().is_some(), "the client's side is up too");
        assert_eq!(m.peer, ib);
        // The client dies: no DREQ from its CM.
        drop(c1);
        router.detach(1);
        loop {
            match rb.recv_timeout(Duration::from_secs(5)) {
                Ok(CmEvent::Disconnected { conn }) => {
                    assert_eq!(conn, cb);
                    break;
                }
                Ok(CmEvent::Established { .. }) => continue,
                e => panic!("the peer was never told: {e:?}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        thread.join().unwrap();
    }

    #[test]
    fn a_departed_clients_dreq_is_sent_again_until_its_peer_answers() {
        let mut f = Farewells::default();
        let (peer, other): (IpAddr, IpAddr) =
            ("198.18.0.2".parse().unwrap(), "198.18.0.3".parse().unwrap());
        let t0 = Instant::now();
        assert!(f.add(7, peer, [1; MAD_LEN], t0));
        assert!(f.add(8, peer, [2; MAD_LEN], t0));
        assert!(f.due(t0).is_empty(), "just sent");
        assert_eq!(f.next_due(), Some(t0 + FAREWELL_WAIT));
        // No answer: again at 100, 300 and 700 ms, then given up.
        let again = f.due(t0 + FAREWELL_WAIT);
        assert_eq!(again.len(), 2);
        assert_eq!(again[0].peer, peer);
        // An answer from another host is no answer; the peer's is.
        f.answered(7, other);
        f.answered(8, peer);
        let again = f.due(t0 + FAREWELL_WAIT * 3);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].mad, [1; MAD_LEN]);
        assert_eq!(f.due(t0 + FAREWELL_WAIT * 7).len(), 1, "the fourth");
        assert!(f.due(t0 + FAREWELL_WAIT * 100).is_empty(), "given up");
        assert_eq!(f.next_due(), None, "nothing left to wake for");
        // An ID a client holds again stops its old DREQ.
        assert!(f.add(9, peer, [3; MAD_LEN], t0));
        f.forget(9);
        assert!(f.due(t0 + FAREWELL_WAIT).is_empty());
    }

    #[test]
    fn requests_go_to_the_listener_ids_to_their_owner_strays_are_answered() {
        let (ia, _ea, ib, eb, router) = two_engines(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (r2, s2) = (Arc::clone(&router), Arc::clone(&stop));
        let thread = std::thread::spawn(move || r2.run(&s2));
        let (c1, d1) = p::mad_socketpair().unwrap();
        let (c2, d2) = p::mad_socketpair().unwrap();
        router.attach(1, d1);
        router.attach(2, d2);
        let svc = PortSpace::Tcp.service_id(5000);
        assert!(router.listen(1, svc, true));
        assert!(!router.listen(2, svc, true), "another client's port");

        // B's CM: a REQ for the service reaches client 1.
        let (tb, rb) = mpsc::channel();
        let b = CmService::start(&eb.context(), Box::new(move |e| drop(tb.send(e)))).unwrap();
        let req = burst_cm::req_template(svc, Qpn::new(0x11).unwrap(), Psn::new(1));
        let cb = b.with(|cm, now| cm.connect(now, ia, req)).unwrap();
        let m = mad_on(&c1);
        assert_eq!(m.peer, ib);
        let CmMessage::Req(got) = CmMad::parse(&m.mad).unwrap().message else {
            panic!("not a REQ")
        };
        assert_eq!(got.local_comm_id, cb.0);

        // Client 1 answers as comm ID 77 (a REJ): the ID is now its own;
        // client 2 speaking for it is dropped.
        let mut mad = consumer_rej(77, cb.0);
        assert!(p::send_mad(c1.as_fd(), &GsiMad { peer: ib, mad }));
        match rb.recv_timeout(Duration::from_secs(5)).unwrap() {
            CmEvent::Rejected { conn, rej } => {
                assert_eq!(conn, cb);
                assert_eq!(rej.reason, reason::CONSUMER);
            }
            e => panic!("{e:?}"),
        }
        let before = router.dropped();
        let rtu = CmIds {
            local_comm_id: 77,
            remote_comm_id: 5,
            private_data: [0; 224],
        };
        CmMad::new(2, CmMessage::Rtu(rtu)).emit(&mut mad).unwrap();
        assert!(p::send_mad(c2.as_fd(), &GsiMad { peer: ib, mad }));
        let end = Instant::now() + Duration::from_secs(5);
        while router.dropped() == before {
            assert!(Instant::now() < end, "the forged message was not dropped");
            std::thread::sleep(Duration::from_millis(2));
        }

        // Nobody listens on another service: burstd's CM rejects it (8).
        let other = burst_cm::req_template(
            PortSpace::Tcp.service_id(5001),
            Qpn::new(0x11).unwrap(),
            Psn::new(1),
        );
        let c3 = b.with(|cm, now| cm.connect(now, ia, other)).unwrap();
        match rb.recv_timeout(Duration::from_secs(5)).unwrap() {
            CmEvent::Rejected { conn, rej } => {
                assert_eq!(conn, c3);
                assert_eq!(rej.reason, reason::INVALID_SERVICE_ID);
            }
            e => panic!("{e:?}"),
        }

        // Client 1 leaves: its service is free for client 2.
        router.detach(1);
        assert!(router.listen(2, svc, true));
        stop.store(true, std::sync::atomic::Ordering::Release);
        thread.join().unwrap();
    }
}
