//! The RDMA tests over burst: a [`Side`] is one endpoint (an engine, a
//! registered buffer, CQs and RC QPs); the client side drives the test and
//! the server side plays perftest's passive or echoing part.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{CompletionQueue, Context, Engine, QueuePair};
use burst_verbs::*;
use burst_verbs::{Access, MrKeys};
use burst_verbs::{Mtu, Psn, Qpn};
use burst_verbs::{QpInit, RcParams, RcPeer};

use crate::report::{Bw, Lat, Samples};
use crate::Test;

/// What the peer needs to know about one of our QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub rkey: u32,
    pub addr: u64,
    /// burst's ECE options the QP offers (`burst_verbs::Ece`, burst's
    /// vendor implied): selective repeat when both offer it.
    pub ece: u32,
}

impl Info {
    /// `qpn:psn:gid:rkey:addr:ece` in hex, for the out-of-band line.
    pub fn encode(&self) -> String {
        let g: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{:06x}:{:06x}:{g}:{:08x}:{:016x}:{:x}",
            self.qpn, self.psn, self.rkey, self.addr, self.ece
        )
    }

    /// Parses [`Info::encode`]'s format (an older peer's, without the ECE
    /// field, offers nothing).
    pub fn decode(s: &str) -> Option<Info> {
        let f: Vec<&str> = s.trim().split(':').collect();
        if !(5..=6).contains(&f.len()) || f[2].len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[2].get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Info {
            qpn: u32::from_str_radix(f[0], 16).ok()?,
            psn: u32::from_str_radix(f[1], 16).ok()?,
            gid,
            rkey: u32::from_str_radix(f[3], 16).ok()?,
            addr: u64::from_str_radix(f[4], 16).ok()?,
            ece: match f.get(5) {
                Some(e) => u32::from_str_radix(e, 16).ok()?,
                None => 0,
            },
        })
    }
}

/// Per-test knobs.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub size: usize,
    pub iters: u64,
    pub duration: Option<Duration>,
    pub qps: usize,
    pub tx_depth: u32,
    pub mtu: Mtu,
    pub inline: u32,
    /// Wait for completions on a completion channel instead of busy polling.
    pub events: bool,
    /// Offer selective repeat to the peer (it takes when both offer it).
    pub offer_sr: bool,
}

/// One endpoint. Field order matters: the QPs and CQs go before the engine,
/// and the buffer is deregistered (in `Drop`) before it is freed.
pub struct Side {
    pub qps: Vec<QueuePair>,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    /// The completion channel both CQs report to (event mode).
    channel: Option<std::sync::Arc<burst_verbs::engine::CompChannel>>,
    pub ctx: Context,
    /// The embedded engine (`None` when burstd serves: BURST_DAEMON).
    _engine: Option<Engine>,
    pub mr: MrKeys,
    /// Registered memory: `slot` bytes per QP.
    pub buf: Vec<u8>,
    pub slot: usize,
    psn0: u32,
    /// [`Params::offer_sr`].
    offer_sr: bool,
}

impl Drop for Side {
    fn drop(&mut self) {
        // BURST_BENCH_COUNTERS: the device's counters, for diagnosis.
        if std::env::var_os("BURST_BENCH_COUNTERS").is_some() {
            if let Ok(c) = self.ctx.counters() {
                eprintln!("burst-bench: counters: {c:?}");
            }
        }
        // Waits until the engine holds no reference into `buf`.
        let _ = self.ctx.dereg_mr(self.mr.lkey);
    }
}

fn err<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e:?}")
}

/// The device burst-bench opens on `addr`, as the drop-in would take it
/// from the environment: the packet port (BURST_PORT, BURST_DPDK: a DPDK
/// port owns its address, which need not be the host's) and the congestion
/// control (BURST_CC); at least `mtu`.
pub fn device_config(addr: IpAddr, mtu: Mtu) -> Result<DeviceConfig, String> {
    let port = match std::env::var("BURST_PORT") {
        Ok(name) => Some(
            burst_verbs::config::PortKind::from_name(&name).ok_or_else(|| {
                format!("BURST_PORT={name}: one of udp, af-xdp, af-xdp-generic, dpdk")
            })?,
        ),
        Err(_) => None,
    };
    let mut cfg = if port == Some(burst_verbs::config::PortKind::Dpdk) {
        // The DPDK port owns its address: it need not be the host's.
        let mut c = DeviceConfig::owned_link("burst0", addr);
        c.dpdk = std::env::var("BURST_DPDK").unwrap_or_default();
        c
    } else {
        DeviceConfig::for_addr("burst0", addr).map_err(|e| e.to_string())?
    };
    cfg.mtu = cfg.mtu.max(mtu);
    // The congestion control, as the drop-in takes it (BURST_CC).
    if let Ok(name) = std::env::var("BURST_CC") {
        cfg.congestion_control =
            burst_verbs::config::Algorithm::from_name(&name).ok_or_else(|| {
                format!("BURST_CC={name}: one of loss-window, dcqcn, dcqcn+loss-window, none")
            })?;
    }
    // The copy backend, as the drop-in takes it (BURST_COPY, ...).
    cfg.copy = burst_verbs::config::CopyConfig::from_vars(|k| std::env::var(k).ok(), cfg.copy)
        .map_err(|e| e.to_string())?;
    // Injected loss, as the drop-in takes it (BURST_TEST_DROP: one sent
    // packet in N, at random): loss recovery measured on a real port.
    if let Ok(n) = std::env::var("BURST_TEST_DROP") {
        cfg.drop_every = n
            .trim()
            .parse()
            .map_err(|_| format!("BURST_TEST_DROP={n}: a whole number N (drop 1 in N)"))?;
    }
    // Engine threads, as the drop-in takes them (BURST_THREADS).
    if let Ok(t) = std::env::var("BURST_THREADS") {
        cfg.threads = t
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| format!("BURST_THREADS={t}: 1 to 64"))?;
    }
    // The packet port, as the drop-in takes it (BURST_PORT).
    if let Some(p) = port {
        cfg.port = p;
    }
    Ok(cfg)
}

impl Side {
    /// Opens an engine on `addr` with `qps` RC QPs and `slot` bytes per QP.
    pub fn open(addr: IpAddr, p: &Params, psn0: u32) -> Result<Side, String> {
        // Daemon mode, as the drop-in takes it (BURST_DAEMON): burstd's
        // device, whatever address was asked.
        let cfg = device_config(addr, p.mtu)?;
        let (engine, ctx) = burst_verbs::engine::open_device(&cfg).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd();
        // Each QP's slot: a receive/target half and a source half.
        let slot = 2 * p.size.max(64);
        let mut buf = vec![0u8; slot * p.qps];
        // Each QP's source half carries a pattern of its own (seeded by its
        // first PSN, which the peer learns), so the receiver can check
        // every byte that reached it.
        for i in 0..p.qps {
            let seed = (psn0 + i as u32 * 1000) & 0xff_ffff;
            let src = &mut buf[i * slot + slot / 2..(i + 1) * slot];
            for (off, b) in src.iter_mut().enumerate() {
                *b = pattern(seed, off);
            }
        }
        // SAFETY: `buf` lives in this Side; Drop deregisters it before the
        // Vec is freed (and the engine waits for in-flight users).
        let mr = unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access(1 | 2 | 4 | 8)) }
            .map_err(err("reg_mr"))?;
        // Room for every queue's WRs, within the device's max_cqe (10,240
        // QPs of 128 would ask 2.6 M): the send side signals one WR in
        // `cq_mod`, so its completions outstanding stay far below.
        let depth = ((p.tx_depth as usize * p.qps).max(1) * 2).min(burst_verbs::MAX_CQE as usize);
        let channel = if p.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(err("create_comp_channel"))?,
            )
        } else {
            None
        };
        let scq_id = ctx.create_cq_with(depth, channel.clone());
        let rcq_id = ctx.create_cq_with(depth, channel.clone());
        let mut qps = Vec::new();
        for _ in 0..p.qps {
            let mut init = QpInit::new(QpType::Rc, pd);
            init.caps.max_send_wr = p.tx_depth.max(1);
            init.caps.max_recv_wr = p.tx_depth.max(1);
            init.caps.max_inline_data = p.inline;
            qps.push(
                ctx.create_qp_with(&init, scq_id, rcq_id)
                    .map_err(err("create_qp"))?,
            );
        }
        let (scq, rcq) = (
            ctx.cq(scq_id).ok_or("no cq")?,
            ctx.cq(rcq_id).ok_or("no cq")?,
        );
        Ok(Side {
            qps,
            scq,
            rcq,
            channel,
            ctx,
            _engine: engine,
            mr,
            buf,
            slot,
            psn0,
            offer_sr: p.offer_sr,
        })
    }

    /// Our QPs' descriptions.
    pub fn infos(&self) -> Vec<Info> {
        self.qps
            .iter()
            .enumerate()
            .map(|(i, q)| Info {
                qpn: q.qpn().value(),
                psn: (self.psn0 + i as u32 * 1000) & 0xff_ffff,
                gid: self.ctx.gid(),
                rkey: self.mr.rkey,
                addr: self.mr.addr + (i * self.slot) as u64,
                ece: if self.offer_sr {
                    Ece::offered().options
                } else {
                    0
                },
            })
            .collect()
    }

    /// Moves every QP to RTS towards the peer's QPs.
    pub fn connect(&self, peer: &[Info], mtu: Mtu) -> Result<(), String> {
        if peer.len() != self.qps.len() {
            return Err(format!(
                "peer has {} QPs, we have {}",
                peer.len(),
                self.qps.len()
            ));
        }
        let mine = self.infos();
        for ((q, me), pe) in self.qps.iter().zip(&mine).zip(peer) {
            let mut p = RcParams::new(Psn::new(me.psn), mtu);
            p.access = QpAccess {
                remote_write: true,
                remote_read: true,
                remote_atomic: true,
            };
            p.min_rnr_timer = 1;
            p.rd_atomic = 16;
            let offered = |options| Ece {
                vendor_id: burst_verbs::VENDOR_ID,
                options,
            };
            p.selective_repeat = offered(me.ece).agree(&offered(pe.ece)).selective_repeat();
            let far = RcPeer {
                gid: pe.gid,
                qpn: Qpn::new(pe.qpn).ok_or("bad QPN")?,
                psn: Psn::new(pe.psn),
            };
            q.connect_rc(&far, &p).map_err(err("connect"))?;
        }
        Ok(())
    }

    fn sge(&self, qp: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + (qp * self.slot) as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// The source half of QP `qp`'s slot (what we send from).
    fn src(&self, qp: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + (qp * self.slot + self.slot / 2) as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    fn post_recv(&self, qp: usize, len: usize) -> Result<(), String> {
        let wr = RecvWr {
            wr_id: qp as u64,
            sg_list: [self.sge(qp, len)].into(),
        };
        self.qps[qp].post_recv(&wr).map_err(err("post_recv"))
    }

    /// A completion from `cq`: busy polling, or in event mode the Verbs
    /// loop (poll; arm with req_notify_cq; poll again for the race; sleep on
    /// the channel's fd).
    fn wait(&self, cq: &CompletionQueue, deadline: Instant) -> Result<WorkCompletion, String> {
        loop {
            if let Some(w) = self.next(cq)? {
                return Ok(w);
            }
            if Instant::now() > deadline {
                return Err("timed out waiting for a completion".into());
            }
        }
    }

    /// One completion if there is one; in event mode blocks up to 100 ms
    /// for one.
    fn next(&self, cq: &CompletionQueue) -> Result<Option<WorkCompletion>, String> {
        let check = |w: WorkCompletion| {
            if w.status != WcStatus::Success {
                return Err(format!("completion error {:?} (wr {})", w.status, w.wr_id));
            }
            Ok(Some(w))
        };
        if let Some(w) = cq.poll() {
            return check(w);
        }
        let Some(ch) = &self.channel else {
            return Ok(None);
        };
        self.ctx
            .req_notify_cq(cq.id())
            .map_err(err("req_notify_cq"))?;
        if let Some(w) = cq.poll() {
            return check(w);
        }
        // Blocks, stepping the device when its port has traffic.
        let _ = self.ctx.wait_cq_event(ch, Duration::from_millis(100));
        Ok(None)
    }
}

/// Byte `off` of the source pattern of the QP whose first PSN is `seed`.
fn pattern(seed: u32, off: usize) -> u8 {
    let x = (seed as usize).wrapping_mul(0x9e37_79b9) ^ off.wrapping_mul(31) ^ (off >> 8);
    (x ^ (x >> 13)) as u8
}

/// Whether this side's target halves receive the peer's data in `test`
/// (`server`: the passive side).
fn receives_data(test: Test, server: bool) -> bool {
    match test {
        Test::WriteBw | Test::SendBw => server,
        Test::ReadBw | Test::ReadLat => !server,
        Test::SendLat | Test::WriteLat => true,
        Test::AtomicBw | Test::AtomicLat => false,
    }
}

impl Side {
    /// Checks that every byte the peer's messages put in our target halves
    /// is the peer's pattern (the data verified end to end). Tests where
    /// this side receives nothing, or nothing arrived, pass.
    pub fn verify(
        &self,
        test: Test,
        peer: &[Info],
        p: &Params,
        server: bool,
    ) -> Result<(), String> {
        if !receives_data(test, server) {
            return Ok(());
        }
        let len = msg_len(test, p.size);
        // write_lat's last byte carries the iteration, not the pattern.
        let checked = if test == Test::WriteLat {
            len.saturating_sub(1)
        } else {
            len
        };
        for (i, info) in peer.iter().enumerate().take(self.qps.len()) {
            // SAFETY: our registered buffer; the run is over, so nothing
            // writes it while we read.
            let got = unsafe {
                std::slice::from_raw_parts(self.buf.as_ptr().add(i * self.slot), checked)
            };
            if got.iter().all(|&b| b == 0) {
                continue; // nothing arrived on this QP (e.g. a short bidir run)
            }
            if let Some(off) = (0..checked).find(|&o| got[o] != pattern(info.psn, o)) {
                return Err(format!(
                    "data mismatch: QP {i} byte {off} is {:#04x}, the peer sent {:#04x}",
                    got[off],
                    pattern(info.psn, off)
                ));
            }
        }
        Ok(())
    }
}

/// The operation of message `i`: WRITEs and atomics target the peer's
/// target half, READs read its source half (`half` bytes further: both
/// sides' slots are the same size), so what arrives is the peer's pattern.
fn op_for(test: Test, peer: &Info, i: u64, half: u64) -> SendOp {
    let (remote_addr, rkey) = (peer.addr, peer.rkey);
    match test {
        Test::WriteBw | Test::WriteLat => SendOp::Write { remote_addr, rkey },
        Test::ReadBw | Test::ReadLat => SendOp::Read {
            remote_addr: remote_addr + half,
            rkey,
        },
        Test::AtomicBw | Test::AtomicLat => {
            if i % 2 == 0 {
                SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                }
            } else {
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 0,
                }
            }
        }
        _ => SendOp::Send,
    }
}

fn msg_len(test: Test, size: usize) -> usize {
    match test {
        Test::AtomicBw | Test::AtomicLat => 8,
        _ => size,
    }
}

/// The driving side of a bandwidth test: `tx_depth` WRs in flight per QP,
/// one signalled completion per `cq_mod` WRs, as perftest does.
pub fn bw(test: Test, s: &Side, peer: &[Info], p: &Params, name: &str) -> Result<Bw, String> {
    let len = msg_len(test, p.size);
    let depth = u64::from(p.tx_depth.max(1));
    let cq_mod = depth.clamp(1, 100);
    let nq = s.qps.len();
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let target = p.iters;
    let start = Instant::now();
    let end = p.duration.map(|d| start + d);
    let deadline = start + p.duration.unwrap_or(Duration::from_secs(0)) + Duration::from_secs(120);
    let pb = crate::report::progress(if end.is_some() { 0 } else { target * nq as u64 }, name);
    let before = s.ctx.counters().map_err(err("counters"))?;
    // In duration mode, stop posting at the end and count what the
    // signalled completions cover (unsignalled tail WRs are not waited for).
    let signalled = |posted: u64| -> u64 {
        if end.is_some() {
            posted / cq_mod * cq_mod
        } else {
            posted
        }
    };
    // QPs with room to post, each listed once (all at first, then each as
    // a completion frees room): a round costs what it posts, not a walk
    // over every QP (10,240 of them).
    let mut ready: std::collections::VecDeque<usize> = (0..nq).collect();
    let mut listed = vec![true; nq];
    // QPs whose signalled WRs are not all complete, and QPs that posted
    // their last WR (iterations mode), kept as counts.
    let mut unfinished = 0usize;
    let mut all_posted = 0usize;
    loop {
        let time_up = end.is_some_and(|e| Instant::now() >= e);
        let more = |posted: u64| {
            if end.is_some() {
                !time_up
            } else {
                posted < target
            }
        };
        while let Some(q) = ready.pop_front() {
            listed[q] = false;
            let was = done[q] < signalled(posted[q]);
            let before = posted[q];
            while more(posted[q]) && posted[q] - done[q] < depth {
                let i = posted[q];
                let local = if matches!(test, Test::ReadBw | Test::AtomicBw) {
                    s.sge(q, len)
                } else {
                    s.src(q, len)
                };
                let mut wr = SendWr::new(
                    q as u64,
                    op_for(test, &peer[q], i, (s.slot / 2) as u64),
                    [local],
                );
                wr.signaled = (i + 1) % cq_mod == 0 || (end.is_none() && i + 1 == target);
                if p.inline as usize >= len && matches!(test, Test::WriteBw | Test::SendBw) {
                    wr.inline = true;
                }
                s.qps[q].post_send(&wr).map_err(err("post_send"))?;
                posted[q] += 1;
            }
            let now = done[q] < signalled(posted[q]);
            unfinished = unfinished + usize::from(now) - usize::from(was);
            if end.is_none() && before < target && posted[q] >= target {
                all_posted += 1;
            }
        }
        let finished = unfinished == 0;
        if finished && (time_up || (end.is_none() && all_posted == nq)) {
            break;
        }
        if finished {
            // Duration mode between rounds: every QP may post again.
            for (q, l) in listed.iter_mut().enumerate() {
                if !*l {
                    *l = true;
                    ready.push_back(q);
                }
            }
            continue;
        }
        let w = s.wait(&s.scq, deadline)?;
        let q = w.wr_id as usize;
        let was = done[q] < signalled(posted[q]);
        let n = (posted[q] - done[q]).min(cq_mod);
        done[q] += n;
        let now = done[q] < signalled(posted[q]);
        unfinished = unfinished + usize::from(now) - usize::from(was);
        pb.inc(n);
        if !listed[q] {
            listed[q] = true;
            ready.push_back(q);
        }
    }
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let msgs: u64 = done.iter().sum();
    let all = s.ctx.counters().map_err(err("counters"))?;
    let after = &all.qps;
    let cuts = all.cc.window_cuts - before.cc.window_cuts;
    let dropped = all.port.rx_dropped.saturating_sub(before.port.rx_dropped);
    let before = &before.qps;
    Ok(Bw {
        test: test.name().into(),
        transport: "burst".into(),
        bytes: len,
        iters: msgs,
        gbps: msgs as f64 * len as f64 * 8.0 / secs / 1e9,
        mpps: msgs as f64 / secs / 1e6,
        secs,
        retransmitted_pkts: after.retransmitted_pkts - before.retransmitted_pkts,
        retransmits_started: after.retransmits_started - before.retransmits_started,
        ack_timeouts: after.completer_retry_err - before.completer_retry_err,
        sr_probes: after.sr_probes - before.sr_probes,
        sr_go_backs: after.sr_go_backs - before.sr_go_backs,
        window_cuts: cuts,
        rx_dropped: [dropped, 0],
        cpu_secs: 0.0,
        client_cpu_secs: 0.0,
        ns_per_pkt: [0.0; 2],
        cores_at_400g: [0.0; 2],
    })
}

/// The receiving side of send_bw: keeps receives posted until `stop`.
pub fn sink(s: &Side, p: &Params, stop: &AtomicBool) -> Result<u64, String> {
    let depth = p.tx_depth.max(16) as usize;
    for q in 0..s.qps.len() {
        for _ in 0..depth {
            s.post_recv(q, p.size)?;
        }
    }
    let mut got = 0;
    while !stop.load(Ordering::Acquire) {
        if let Some(w) = s.next(&s.rcq)? {
            got += 1;
            s.post_recv(w.wr_id as usize, p.size)?;
        }
    }
    Ok(got)
}

/// Waits until `stop` (passive side of WRITE/READ/atomic): the engine
/// thread serves the peer, as it would for a perftest server that only
/// waits on its TCP socket.
pub fn idle(s: &Side, stop: &AtomicBool) {
    s.ctx.park();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Latency tests. `ping` drives and measures; the other side calls
/// [`pong`]. READ and atomic latency need no partner (the peer idles).
pub fn lat(test: Test, s: &Side, peer: &[Info], p: &Params) -> Result<Lat, String> {
    let len = msg_len(test, p.size);
    let mut h = Samples::new();
    let deadline = Instant::now() + Duration::from_secs(120) + p.duration.unwrap_or_default();
    let end = p.duration.map(|d| Instant::now() + d);
    let n = if end.is_some() { u64::MAX } else { p.iters };
    let pb = crate::report::progress(if end.is_some() { 0 } else { n }, test.name());
    if test == Test::SendLat {
        for _ in 0..4 {
            s.post_recv(0, len)?;
        }
    }
    let mut i = 0u64;
    while i < n && end.is_none_or(|e| Instant::now() < e) {
        let t = Instant::now();
        match test {
            Test::SendLat => {
                let mut wr = SendWr::new(i, SendOp::Send, [s.src(0, len)]);
                wr.signaled = false;
                if p.inline as usize >= len {
                    wr.inline = true;
                }
                s.qps[0].post_send(&wr).map_err(err("post_send"))?;
                s.wait(&s.rcq, deadline)?;
                h.record(t.elapsed().as_nanos() as u64 / 2);
                s.post_recv(0, len)?;
            }
            Test::WriteLat => {
                let v = (i as u8).wrapping_add(1);
                post_write_lat(test, s, peer, p, i, len, v)?;
                wait_byte(s, len - 1, v, deadline)?;
                h.record(t.elapsed().as_nanos() as u64 / 2);
                while s.scq.poll().is_some() {}
            }
            _ => {
                let wr = SendWr::new(
                    i,
                    op_for(test, &peer[0], i, (s.slot / 2) as u64),
                    [s.sge(0, len)],
                );
                s.qps[0].post_send(&wr).map_err(err("post_send"))?;
                s.wait(&s.scq, deadline)?;
                h.record(t.elapsed().as_nanos() as u64);
            }
        }
        i += 1;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let half = matches!(test, Test::SendLat | Test::WriteLat);
    Ok(h.lat(test.name(), "burst", len, half, s.channel.is_some()))
}

/// One write_lat message: the source's last byte carries the iteration `v`
/// (the peer polls the same byte of its target half), then the WRITE.
fn post_write_lat(
    test: Test,
    s: &Side,
    peer: &[Info],
    p: &Params,
    i: u64,
    len: usize,
    v: u8,
) -> Result<(), String> {
    // SAFETY: the source half's last byte, inside our registered buffer,
    // which we own; the engine reads it when building the packet.
    unsafe { std::ptr::write_volatile(s.buf.as_ptr().add(s.slot / 2 + len - 1).cast_mut(), v) };
    let mut wr = SendWr::new(
        i,
        op_for(test, &peer[0], i, (s.slot / 2) as u64),
        [s.src(0, len)],
    );
    wr.signaled = i % 64 == 63;
    wr.inline = p.inline as usize >= len;
    s.qps[0].post_send(&wr).map_err(err("post_send"))
}

/// Spins until our buffer's byte `at` reads `v`, stepping the engine (the
/// application polls memory here, as perftest's write_lat does).
fn wait_byte(s: &Side, at: usize, v: u8, deadline: Instant) -> Result<(), String> {
    loop {
        // SAFETY: a byte of our registered buffer; the engine writes it.
        if unsafe { std::ptr::read_volatile(s.buf.as_ptr().add(at)) } == v {
            return Ok(());
        }
        s.ctx.progress();
        if Instant::now() > deadline {
            return Err("timed out waiting for the peer's write".into());
        }
    }
}

/// The echoing side of send_lat / write_lat, until `stop`.
pub fn pong(
    test: Test,
    s: &Side,
    peer: &[Info],
    p: &Params,
    stop: &AtomicBool,
) -> Result<(), String> {
    let len = msg_len(test, p.size);
    if test == Test::SendLat {
        for _ in 0..4 {
            s.post_recv(0, len)?;
        }
    }
    let mut i = 0u64;
    while !stop.load(Ordering::Acquire) {
        match test {
            Test::SendLat => {
                if s.next(&s.rcq)?.is_none() {
                    continue;
                }
                s.post_recv(0, len)?;
                let mut wr = SendWr::new(i, SendOp::Send, [s.src(0, len)]);
                wr.signaled = false;
                if p.inline as usize >= len {
                    wr.inline = true;
                }
                s.qps[0].post_send(&wr).map_err(err("post_send"))?;
            }
            Test::WriteLat => {
                let v = (i as u8).wrapping_add(1);
                let at = len - 1;
                // SAFETY: a byte of our registered buffer.
                if unsafe { std::ptr::read_volatile(s.buf.as_ptr().add(at)) } != v {
                    s.ctx.progress();
                    continue;
                }
                post_write_lat(test, s, peer, p, i, len, v)?;
                while s.scq.poll().is_some() {}
            }
            _ => {
                idle(s, stop);
                return Ok(());
            }
        }
        i += 1;
    }
    Ok(())
}
