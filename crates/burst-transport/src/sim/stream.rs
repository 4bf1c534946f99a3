//! A long stream of WRITEs over one RC pair, for goodput under loss:
//! what selective repeat is measured by against go-back-N. Every WRITE is
//! checked at its completion (the responder's copy equals what was sent),
//! so a fast wrong answer cannot pass.
//!
//! ```text
//! cargo run --release -p burst-transport --example sim -- --stream \
//!     --loss 0.01 --repeat selective [--bytes N] [--size BYTES] [--depth D]
//! ```

use super::*;

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
    /// WRITEs outstanding at once.
    pub depth: usize,
    /// Simulated time limit.
    pub deadline: Nanos,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            faults: Faults::default(),
            repeat: Repeat::Selective,
            bytes: 256 << 20,
            size: 64 << 10,
            depth: 32,
            deadline: 60_000_000_000,
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
    /// The two QPs' counters, summed.
    pub counters: Counters,
}

impl StreamSummary {
    /// Goodput, Gb/s of checked bytes over simulated time.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.sim_ns.max(1) as f64
    }
}

/// Streams `o.bytes` of WRITEs from node 0 to node 1 over `w` (MTU 4096),
/// `o.depth` at a time, each checked when it completes.
pub fn run_stream<F: Fabric>(
    w: &mut F,
    seed: u64,
    o: &StreamOptions,
) -> Result<StreamSummary, String> {
    let mut rng = Rng::new(seed);
    let mtu = Mtu::Mtu4096;
    let a = w.add_qp(0, QpType::Rc, mtu);
    let b = w.add_qp(1, QpType::Rc, mtu);
    w.connect(
        a,
        Some(b),
        mtu,
        Psn::new(rng.below(1 << 24) as u32),
        Psn::new(7),
    )
    .map_err(|e| e.to_string())?;
    let (req, resp) = match o.repeat {
        Repeat::BySeed => (true, true),
        r => r.ends(seed, 0),
    };
    w.set_selective_repeat(a, req).map_err(|e| e.to_string())?;
    w.set_selective_repeat(b, resp).map_err(|e| e.to_string())?;
    let (size, depth) = (o.size.max(1), o.depth.max(1));
    let (src, src_va) = w.register(0, size * depth);
    let (dst, dst_va) = w.register(1, size * depth);
    let total = o.bytes.div_ceil(size as u64);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut failure: Option<String> = None;
    // Posts WRITE `i` from slot i % depth, with fresh bytes.
    let post = |w: &mut F, rng: &mut Rng, i: u64| -> Result<(), String> {
        let slot = (i % depth as u64) as usize * size;
        fill(rng, &mut w.bytes_mut(0, src)[slot..slot + size]);
        let sge = Sge {
            addr: src_va + slot as u64,
            length: size as u32,
            lkey: src,
        };
        let op = SendOp::Write {
            remote_addr: dst_va + slot as u64,
            rkey: dst,
        };
        w.post_send(a, SendWr::new(i, op, [sge]))
            .map_err(|e| format!("post_send: {e}"))
    };
    while posted < total.min(depth as u64) {
        post(w, &mut rng, posted)?;
        posted += 1;
    }
    let finished = w.run(o.deadline, &mut |w: &mut F| {
        while let Some(c) = w.completions(a).pop_front() {
            if c.status != WcStatus::Success || c.wr_id != done {
                failure = Some(format!(
                    "WRITE {} completed as {:?} (wr_id {})",
                    done, c.status, c.wr_id
                ));
                return true;
            }
            let slot = (done % depth as u64) as usize * size;
            if w.bytes(0, src)[slot..slot + size] != w.bytes(1, dst)[slot..slot + size] {
                failure = Some(format!("WRITE {done}: the responder's bytes differ"));
                return true;
            }
            done += 1;
            if posted < total {
                if let Err(e) = post(w, &mut rng, posted) {
                    failure = Some(e);
                    return true;
                }
                posted += 1;
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
            "seed {seed}: {done} of {total} WRITEs done by {} ns ({})",
            o.deadline,
            w.describe_qps().join("; ")
        ));
    }
    Ok(StreamSummary {
        bytes: done * size as u64,
        sim_ns: w.now(),
        net: w.net_stats(),
        counters: w.qp_counters(),
    })
}
