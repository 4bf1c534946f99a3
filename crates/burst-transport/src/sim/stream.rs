//! A long stream of WRITEs (or READs, or SENDs) over RC pairs, for
//! goodput under loss: what selective repeat is measured by against
//! go-back-N. Every message is checked at its completion (the
//! destination's copy equals the source's), so a fast wrong answer cannot
//! pass.
//!
//! ```text
//! cargo run --release -p burst-transport --example sim -- --stream \
//!     --loss 0.01 --repeat selective [--bytes N] [--size BYTES] [--depth D] [--flows N] \
//!     [--read | --send]
//! ```

use super::*;

/// The operation a stream moves its bytes with, node 0 to node 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamOp {
    /// Node 0 WRITEs its slots into node 1's.
    #[default]
    Write,
    /// Node 0 READs node 1's slots into its own (the bytes flow the same
    /// way, as responses).
    Read,
    /// Node 0 SENDs its slots into receives node 1 posts, one per
    /// message, on the slot the message's WRITE would fill.
    Send,
}

impl StreamOp {
    /// The operation's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            StreamOp::Write => "WRITE",
            StreamOp::Read => "READ",
            StreamOp::Send => "SEND",
        }
    }
}

/// What to stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamOptions {
    /// Network faults.
    pub faults: Faults,
    /// Which ends repeat selectively (`BySeed` counts as both).
    pub repeat: Repeat,
    /// Bytes to move in all.
    pub bytes: u64,
    /// Bytes per WRITE.
    pub size: usize,
    /// WRITEs outstanding at once on each flow.
    pub depth: usize,
    /// RC pairs streaming at once, node 0 to node 1 (one peer).
    pub flows: usize,
    /// Simulated time limit.
    pub deadline: Nanos,
    /// The operation.
    pub op: StreamOp,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            faults: Faults::default(),
            repeat: Repeat::Selective,
            bytes: 256 << 20,
            size: 64 << 10,
            depth: 32,
            flows: 1,
            deadline: 60_000_000_000,
            op: StreamOp::Write,
        }
    }
}

/// The outcome of a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamSummary {
    /// Bytes written and checked.
    pub bytes: u64,
    /// Simulated nanoseconds the stream took.
    pub sim_ns: Nanos,
    /// Network statistics.
    pub net: NetStats,
    /// The QPs' counters, summed.
    pub counters: Counters,
    /// Jain's fairness index of the flows' shares (1: equal).
    pub jain: f64,
}

impl StreamSummary {
    /// Goodput, Gb/s of checked bytes over simulated time.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.sim_ns.max(1) as f64
    }
}

/// Streams `o.bytes` of WRITEs from node 0 to node 1 over `w` (MTU 4096)
/// on `o.flows` RC pairs, `o.depth` WRITEs outstanding on each, every
/// WRITE checked when it completes; the run ends when the flows together
/// completed `o.bytes`, and their shares give Jain's fairness index.
/// `o.op` READs or SENDs the bytes instead ([`StreamOp`]).
pub fn run_stream<F: Fabric>(
    w: &mut F,
    seed: u64,
    o: &StreamOptions,
) -> Result<StreamSummary, String> {
    let mut rng = Rng::new(seed);
    let mtu = Mtu::Mtu4096;
    let (req, resp) = match o.repeat {
        Repeat::BySeed => (true, true),
        r => r.ends(seed, 0),
    };
    let (size, depth) = (o.size.max(1), o.depth.max(1));
    let mut flows = Vec::new();
    for _ in 0..o.flows.max(1) {
        let a = w.add_qp(0, QpType::Rc, mtu);
        let b = w.add_qp(1, QpType::Rc, mtu);
        let psn = Psn::new(rng.below(1 << 24) as u32);
        w.connect(a, Some(b), mtu, psn, Psn::new(7))
            .map_err(|e| e.to_string())?;
        w.set_selective_repeat(a, req).map_err(|e| e.to_string())?;
        w.set_selective_repeat(b, resp).map_err(|e| e.to_string())?;
        let (src, src_va) = w.register(0, size * depth);
        let (dst, dst_va) = w.register(1, size * depth);
        flows.push(Flow {
            a,
            b,
            src: (src, src_va),
            dst: (dst, dst_va),
            posted: 0,
            done: 0,
            received: 0,
        });
    }
    let total = o.bytes.div_ceil(size as u64);
    let mut failure: Option<String> = None;
    // Posts flow f's next message from its slot posted % depth, fresh
    // bytes: a WRITE or SEND of node 0's slot to node 1's, or a READ of
    // node 1's slot into node 0's.
    let (read, send) = (o.op == StreamOp::Read, o.op == StreamOp::Send);
    let post = |w: &mut F, rng: &mut Rng, f: &mut Flow| -> Result<(), String> {
        let slot = (f.posted % depth as u64) as usize * size;
        let (local, remote) = (f.src, f.dst);
        if send {
            let sge = Sge {
                addr: remote.1 + slot as u64,
                length: size as u32,
                lkey: remote.0,
            };
            let rwr = RecvWr {
                wr_id: f.posted,
                sg_list: SgList::from([sge]),
            };
            w.post_recv(f.b, rwr)
                .map_err(|e| format!("post_recv: {e}"))?;
        }
        let (node, key) = if read { (1, remote.0) } else { (0, local.0) };
        fill(rng, &mut w.bytes_mut(node, key)[slot..slot + size]);
        let sge = Sge {
            addr: local.1 + slot as u64,
            length: size as u32,
            lkey: local.0,
        };
        let op = if send {
            SendOp::Send
        } else if read {
            SendOp::Read {
                remote_addr: remote.1 + slot as u64,
                rkey: remote.0,
            }
        } else {
            SendOp::Write {
                remote_addr: remote.1 + slot as u64,
                rkey: remote.0,
            }
        };
        w.post_send(f.a, SendWr::new(f.posted, op, [sge]))
            .map_err(|e| format!("post_send: {e}"))?;
        f.posted += 1;
        Ok(())
    };
    for f in flows.iter_mut() {
        for _ in 0..depth {
            post(w, &mut rng, f)?;
        }
    }
    let what = o.op.name();
    let mut done = 0u64;
    let finished = w.run(o.deadline, &mut |w: &mut F| {
        for f in flows.iter_mut() {
            // The receives' completions: in order, whole messages.
            while let Some(c) = w.completions(f.b).pop_front() {
                if c.status != WcStatus::Success
                    || c.wr_id != f.received
                    || c.byte_len as usize != size
                {
                    failure = Some(format!(
                        "flow {}: receive {} completed as {:?} (wr_id {}, {} bytes)",
                        f.a, f.received, c.status, c.wr_id, c.byte_len
                    ));
                    return true;
                }
                f.received += 1;
            }
            while let Some(c) = w.completions(f.a).pop_front() {
                if c.status != WcStatus::Success || c.wr_id != f.done {
                    failure = Some(format!(
                        "flow {}: {what} {} completed as {:?} (wr_id {})",
                        f.a, f.done, c.status, c.wr_id
                    ));
                    return true;
                }
                let slot = (f.done % depth as u64) as usize * size;
                if w.bytes(0, f.src.0)[slot..slot + size] != w.bytes(1, f.dst.0)[slot..slot + size]
                {
                    failure = Some(format!("flow {}: {what} {}: the bytes differ", f.a, f.done));
                    return true;
                }
                f.done += 1;
                done += 1;
                if done < total {
                    if let Err(e) = post(w, &mut rng, f) {
                        failure = Some(e);
                        return true;
                    }
                }
            }
        }
        done >= total
    });
    if let Some(f) = failure {
        return Err(format!("seed {seed}: {f}"));
    }
    if let Some(v) = w.violation() {
        return Err(format!("seed {seed}: invariant broken {v}"));
    }
    if !finished {
        return Err(format!(
            "seed {seed}: {done} of {total} {what}s done by {} ns",
            o.deadline
        ));
    }
    // Jain's index over the flows' completed WRITEs: 1 when equal, 1/n
    // when one flow had it all.
    let x: Vec<f64> = flows.iter().map(|f| f.done as f64).collect();
    let (sum, sq) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
    Ok(StreamSummary {
        bytes: done * size as u64,
        sim_ns: w.now(),
        net: w.net_stats(),
        counters: w.qp_counters(),
        jain: if sq > 0.0 {
            sum * sum / (x.len() as f64 * sq)
        } else {
            1.0
        },
    })
}

/// One flow of a stream: its requester QP, source and destination
/// regions (key, address), WRITEs posted and completed.
struct Flow {
    a: usize,
    b: usize,
    src: (u32, u64),
    dst: (u32, u64),
    posted: u64,
    done: u64,
    received: u64,
}
