//! A shared bottleneck on simulated time, for congestion control: `n`
//! sender devices, each with one RC QP writing 64 KiB messages to its own
//! QP on one receiver device, whose port drains at a fraction of the
//! senders' link rate (a switch egress or a slow host) and marks CE above
//! a queue threshold. Every device is a real engine over a
//! [`burst_io::SimNet`] port, on one manual clock.
//!
//! [`run`] reports each flow's rate over time, the bottleneck queue over
//! time, Jain's fairness index and the time to converge: the issue's
//! checks (`tests/congestion.rs`) and the bench report's plots
//! (`cargo run --release -p burst-verbs --example bottleneck`).
//!
//! ```
//! use burst_verbs::bottleneck::{run, Scenario};
//! use burst_cc::{Algorithm, DcqcnConfig};
//! let mut s = Scenario::new(2, Algorithm::Dcqcn(DcqcnConfig::with_line_rate(25_000_000_000 / 8)));
//! s.duration_ns = 2_000_000;
//! let r = run(&s);
//! assert_eq!(r.flows.len(), 2);
//! assert!(r.delivered_bytes > 0);
//! ```

use std::net::SocketAddr;

use burst_cc::{jain_index, Algorithm};
use burst_io::{SimFaults, SimNet};
use burst_mem::{Access, MrKeys, Pd};
use burst_transport::{QpAccess, QpType, SendOp, SendWr, Sge, WcStatus};
use burst_wire::{Mtu, Psn};

use crate::clock::Clock;
use crate::engine::{Context, CqId, Drive, Engine, EngineOptions, QueuePair};
use crate::{QpInit, RcParams, RcPeer};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Sender devices (one flow each).
    pub flows: usize,
    /// The congestion control every device runs.
    pub algorithm: Algorithm,
    /// Each sender's link, Gb/s.
    pub link_gbps: u64,
    /// The bottleneck: the receiver's drain rate, Gb/s.
    pub bottleneck_gbps: u64,
    /// Packets the bottleneck queue holds before it drops.
    pub queue_limit: usize,
    /// RED marking (packets queued): from `Kmin` with a probability rising
    /// to `Pmax` at `Kmax`, every packet beyond.
    pub ecn_kmin: usize,
    /// See `ecn_kmin`.
    pub ecn_kmax: usize,
    /// See `ecn_kmin`.
    pub ecn_pmax: f64,
    /// Flow `i` starts at `i * stagger_ns`.
    pub stagger_ns: u64,
    /// Simulated time.
    pub duration_ns: u64,
    /// Rate sampling interval.
    pub interval_ns: u64,
    /// Message size.
    pub message: usize,
    /// Messages each flow keeps posted.
    pub depth: usize,
}

impl Scenario {
    /// `flows` senders at 25 Gb/s into a 10 Gb/s bottleneck with a
    /// 1024-packet (4 MiB) queue marking as the DCQCN paper's switches
    /// (`Kmin` 5 KB, `Kmax` 200 KB, `Pmax` 1%: 2 and 50 packets of 4 KiB),
    /// flows starting over the first 10 ms (at most 1 ms apart), 40 ms.
    pub fn new(flows: usize, algorithm: Algorithm) -> Scenario {
        Scenario {
            flows,
            algorithm,
            link_gbps: 25,
            bottleneck_gbps: 10,
            queue_limit: 1024,
            ecn_kmin: 2,
            ecn_kmax: 50,
            ecn_pmax: 0.01,
            stagger_ns: (10_000_000 / flows.max(1) as u64).min(1_000_000),
            duration_ns: 40_000_000,
            interval_ns: 1_000_000,
            message: 16 << 10,
            depth: 64,
        }
    }
}

/// What [`run`] measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Each flow's rate (Gb/s) in each interval.
    pub flows: Vec<Vec<f64>>,
    /// The bottleneck queue (packets) at the end of each interval.
    pub queue: Vec<usize>,
    /// The largest bottleneck queue seen.
    pub max_queue: u64,
    /// Jain's index of the flows' rates over the last half of the run (0
    /// when no flow moved: a collapse is not fairness).
    pub jain: f64,
    /// How long (ns) after the last flow started their rates (averaged
    /// over 4 intervals) reached Jain's index 0.95 and stayed there; `None`
    /// if they never did.
    pub converged_ns: Option<u64>,
    /// Bytes delivered in all.
    pub delivered_bytes: u64,
    /// Packets the bottleneck dropped.
    pub dropped: u64,
    /// Packets marked CE.
    pub marked: u64,
    /// Work requests that failed.
    pub failed: u64,
    /// The receiver's congestion counters (CNPs sent, CE seen).
    pub receiver_cc: crate::CongestionCounters,
    /// The senders' congestion counters, summed (CNPs received, cuts).
    pub senders_cc: crate::CongestionCounters,
}

impl Report {
    /// The aggregate rate over the last half (Gb/s).
    pub fn total_gbps(&self) -> f64 {
        let half = self.flows.first().map_or(0, |f| f.len() / 2);
        let n = self.flows.first().map_or(0, |f| f.len() - half).max(1);
        self.flows
            .iter()
            .map(|f| f[half..].iter().sum::<f64>())
            .sum::<f64>()
            / n as f64
    }
}

struct Flow {
    ctx: Context,
    qp: QueuePair,
    cq: CqId,
    keys: MrKeys,
    remote: MrKeys,
    posted: usize,
    started: bool,
    bytes: u64,
    _buf: Vec<u8>,
}

fn engine(net: &SimNet, addr: SocketAddr, algo: Algorithm) -> Engine {
    let mut o = EngineOptions::new(Mtu::Mtu4096);
    o.drive = Drive::Caller;
    o.clock = Clock::manual();
    o.congestion_control = algo;
    Engine::with_port(net.port(addr), o).expect("a simulated port needs no system resource")
}

fn params(psn: u32) -> RcParams {
    let mut p = RcParams::new(Psn::new(psn), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: false,
    };
    p.timeout = 14;
    p.retry_cnt = 7;
    p
}

/// Runs `s` (deterministic: the same scenario gives the same report).
pub fn run(s: &Scenario) -> Report {
    let faults = SimFaults {
        link_gbps: s.link_gbps,
        rx_gbps: 0,
        rx_queue: 0,
        ..SimFaults::default()
    };
    let net = SimNet::new(7, faults);
    // The receiver drains at the bottleneck rate: its own port's limit.
    net.set_faults(SimFaults {
        rx_gbps: s.bottleneck_gbps,
        rx_queue: s.queue_limit,
        ecn_threshold: s.ecn_kmin,
        ecn_max: s.ecn_kmax,
        ecn_pmax: s.ecn_pmax,
        ..faults
    });
    let raddr: SocketAddr = "198.18.0.1:4791".parse().expect("literal");
    let recv = engine(&net, raddr, s.algorithm);
    let rctx = recv.context();
    let rcq = rctx.create_cq(64);
    let mut engines = vec![recv];
    let (mut flows, rbufs, senders) = start_flows(&net, s, &rctx, rcq);
    engines.extend(senders);
    let (rates, queue, failed) = drive(&net, s, &mut flows, &rctx, rcq, raddr);
    let st = net.stats();
    let delivered_bytes = flows.iter().map(|f| f.bytes).sum();
    let receiver_cc = rctx.counters().map(|c| c.cc).unwrap_or_default();
    let mut senders_cc = crate::CongestionCounters::default();
    for c in flows.iter().filter_map(|f| f.ctx.counters().ok()) {
        senders_cc.add(&c.cc);
    }
    // The devices go (and flush) while the memory they registered lives.
    drop(flows);
    drop(rctx);
    drop(engines);
    drop(rbufs);
    let (jain, converged_ns) = fairness_of(s, &rates);
    Report {
        jain,
        flows: rates,
        queue,
        max_queue: st.max_rx_queue,
        converged_ns,
        delivered_bytes,
        dropped: st.overflowed,
        marked: st.ecn_marked,
        failed,
        receiver_cc,
        senders_cc,
    }
}

/// The receiver's buffers (with their QPs) of [`start_flows`].
type Sinks = Vec<(QueuePair, Vec<u8>)>;

/// One engine, QP and buffer per flow, each connected to a QP of the
/// receiver `rctx` completing into `rcq`.
fn start_flows(
    net: &SimNet,
    s: &Scenario,
    rctx: &Context,
    rcq: CqId,
) -> (Vec<Flow>, Sinks, Vec<Engine>) {
    let rpd = rctx.alloc_pd();
    let mut engines = Vec::new();
    let mut flows = Vec::new();
    let mut rbufs = Vec::new();
    for i in 0..s.flows {
        let addr: SocketAddr = format!("198.18.0.{}:4791", 10 + i % 240)
            .parse()
            .expect("formatted address");
        let e = engine(net, addr, s.algorithm);
        let ctx = e.context();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(s.depth * 2);
        let qp = ctx
            .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
            .expect("a QP");
        let rqp = rctx
            .create_qp_with(&QpInit::new(QpType::Rc, rpd), rcq, rcq)
            .expect("a QP");
        let mut buf = vec![0x5au8; s.message];
        let mut rbuf = vec![0u8; s.message];
        // SAFETY: each buffer lives in `flows`/`rbufs` until the engines
        // are dropped at the end of this function (after the last step).
        let keys = unsafe { ctx.reg_mr(Pd(1), buf.as_mut_ptr(), buf.len(), Access(0xf)) }
            .expect("registration");
        // SAFETY: as above.
        let remote = unsafe { rctx.reg_mr(Pd(1), rbuf.as_mut_ptr(), rbuf.len(), Access(0xf)) }
            .expect("registration");
        let _ = pd;
        qp.connect_rc(
            &RcPeer {
                gid: rctx.gid(),
                qpn: rqp.qpn(),
                psn: Psn::new(0),
            },
            &params(100),
        )
        .expect("connect");
        rqp.connect_rc(
            &RcPeer {
                gid: ctx.gid(),
                qpn: qp.qpn(),
                psn: Psn::new(100),
            },
            &params(0),
        )
        .expect("connect");
        rbufs.push((rqp, rbuf));
        flows.push(Flow {
            ctx,
            qp,
            cq,
            keys,
            remote,
            posted: 0,
            started: false,
            bytes: 0,
            _buf: buf,
        });
        engines.push(e);
    }
    (flows, rbufs, engines)
}

/// Steps every engine on the simulated clock until the scenario's end:
/// each flow keeps `s.depth` WRITEs posted once started. Returns each
/// flow's rate per interval (Gb/s), the bottleneck's queue per interval,
/// and the WRs that failed.
fn drive(
    net: &SimNet,
    s: &Scenario,
    flows: &mut [Flow],
    rctx: &Context,
    rcq: CqId,
    raddr: SocketAddr,
) -> (Vec<Vec<f64>>, Vec<usize>, u64) {
    let intervals = (s.duration_ns / s.interval_ns.max(1)).max(1) as usize;
    let mut rates = vec![vec![0.0; intervals]; s.flows];
    let mut queue = vec![0; intervals];
    let mut last_bytes = vec![0u64; s.flows];
    let mut failed = 0;
    let mut now = 0u64;
    let mut next_sample = s.interval_ns;
    let mut k = 0;
    while k < intervals {
        net.set_now(now);
        let mut moved = false;
        for (i, f) in flows.iter_mut().enumerate() {
            f.ctx.advance_clock_to(now);
            if !f.started && now >= i as u64 * s.stagger_ns {
                f.started = true;
            }
            while f.started && f.posted < s.depth {
                let wr = SendWr::new(
                    1,
                    SendOp::Write {
                        remote_addr: f.remote.addr,
                        rkey: f.remote.rkey,
                    },
                    [Sge {
                        addr: f.keys.addr,
                        length: s.message as u32,
                        lkey: f.keys.lkey,
                    }],
                );
                if f.qp.post_send(&wr).is_err() {
                    break;
                }
                f.posted += 1;
            }
            moved |= f.ctx.progress();
            while let Some(wc) = f.ctx.take_completion(f.cq) {
                f.posted -= 1;
                if wc.status == WcStatus::Success {
                    f.bytes += s.message as u64;
                } else {
                    failed += 1;
                }
            }
        }
        rctx.advance_clock_to(now);
        moved |= rctx.progress();
        while rctx.take_completion(rcq).is_some() {}
        while now >= next_sample && k < intervals {
            for (i, f) in flows.iter().enumerate() {
                rates[i][k] = (f.bytes - last_bytes[i]) as f64 * 8.0 / s.interval_ns as f64;
                last_bytes[i] = f.bytes;
            }
            queue[k] = net.queue_len(raddr);
            k += 1;
            next_sample += s.interval_ns;
        }
        if moved {
            continue;
        }
        let next = std::iter::once(net.next_event())
            .chain(flows.iter().map(|f| f.ctx.next_timeout()))
            .chain(std::iter::once(rctx.next_timeout()))
            .flatten()
            .chain([next_sample, (flows.len() as u64) * s.stagger_ns])
            .filter(|&t| t > now)
            .min()
            .unwrap_or(now + 1_000);
        now = next.max(now + 1);
    }
    (rates, queue, failed)
}

/// Jain's index of the flows' mean rates over the second half, and how
/// long after the last flow started the index stayed at 0.95 or more.
fn fairness_of(s: &Scenario, rates: &[Vec<f64>]) -> (f64, Option<u64>) {
    let intervals = (s.duration_ns / s.interval_ns.max(1)).max(1) as usize;
    let last_start = (s.flows.saturating_sub(1) as u64) * s.stagger_ns;
    // Flows that all stopped (congestion collapse) are not "fair": 0.
    let fairness = |r: &[f64]| {
        if r.iter().sum::<f64>() > 0.0 {
            jain_index(r)
        } else {
            0.0
        }
    };
    let jain_at = |k: usize| {
        let from = k.saturating_sub(3);
        fairness(
            &rates
                .iter()
                .map(|r| r[from..=k].iter().sum::<f64>())
                .collect::<Vec<_>>(),
        )
    };
    let first_all = (last_start / s.interval_ns) as usize + 4;
    let converged_ns = (first_all..intervals)
        .find(|&k0| (k0..intervals).all(|k| jain_at(k) >= 0.95))
        .map(|k0| (k0 as u64 + 1) * s.interval_ns - last_start);
    let half = intervals / 2;
    let means: Vec<f64> = rates
        .iter()
        .map(|r| r[half..].iter().sum::<f64>() / (intervals - half).max(1) as f64)
        .collect();
    (fairness(&means), converged_ns)
}
