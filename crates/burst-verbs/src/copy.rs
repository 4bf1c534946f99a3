//! The copy backend of an engine thread, as configured
//! ([`crate::config::CopyConfig`], `BURST_COPY`): the [`Copier`] its
//! device places and gathers payload through.

use std::io;

use burst_dsa::dsa::model::{DsaModel, ModelPortal, ModelThread};
use burst_dsa::dsa::DsaEngine;
use burst_dsa::{AsyncCopy, Completion, CopyJob, Counters};
use burst_mem::{Copier, CpuMode};

use crate::config::{CopyBackend, CopyConfig};

/// Jobs one engine thread keeps in flight on an offload backend (a
/// receive batch's placements, a transmit round's gathers).
const IN_FLIGHT: usize = 512;

/// Descriptors of the model's work queue (a device's default size).
const MODEL_QUEUE: usize = 128;

/// The copier `cfg` asks for; an error says why a backend is not there.
/// `dpdk` is the device's DPDK text (`dma=NAME` for `dmadev`).
pub(crate) fn open(cfg: &CopyConfig, dpdk: &str) -> io::Result<Copier> {
    if cfg.backend != CopyBackend::default() {
        tracing::info!(
            "copy backend {} (copies of {} bytes and more offloaded)",
            cfg.backend.name(),
            cfg.min_offload
        );
    }
    Ok(match cfg.backend {
        CopyBackend::Cpu => Copier::cpu(CpuMode::Fused),
        CopyBackend::CpuPlain => Copier::cpu(CpuMode::Plain),
        CopyBackend::DsaModel => Copier::offload(Box::new(ModelBackend::start(cfg)?)),
        CopyBackend::Dsa => {
            let wqs = burst_dsa::dsa::discover().map_err(|e| {
                io::Error::new(io::ErrorKind::NotFound, format!("BURST_COPY=dsa: {e}"))
            })?;
            Copier::offload(Box::new(burst_dsa::dsa::hardware::open(
                &wqs,
                IN_FLIGHT,
                cfg.min_offload,
            )?))
        }
        CopyBackend::Dmadev => open_dmadev(cfg, dpdk)?,
    })
}

#[cfg(feature = "dpdk")]
fn open_dmadev(cfg: &CopyConfig, dpdk: &str) -> io::Result<Copier> {
    let c = burst_io::dpdk::DpdkConfig::parse(dpdk);
    let name = c.dma.clone().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "BURST_COPY=dmadev: name the DMA device in BURST_DPDK (dma=NAME, e.g. \
             \"--vdev=dma_skeleton dma=dma_skeleton\")",
        )
    })?;
    let dev = burst_io::dpdk_dma::DmaCopy::open_config(&c, &name, 1024)?;
    Ok(Copier::offload(Box::new(SmallOnCpu::new(
        dev,
        cfg.min_offload,
    ))))
}

#[cfg(not(feature = "dpdk"))]
fn open_dmadev(_: &CopyConfig, _: &str) -> io::Result<Copier> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "BURST_COPY=dmadev: burst was built without DPDK (cargo feature `dpdk`)",
    ))
}

/// A backend that copies jobs below a size on the CPU at submission (a
/// DMA round trip costs more than they do); the rest go to the device.
/// Completions stay in submission order: a CPU-copied job completes when
/// every job before it has.
#[cfg(feature = "dpdk")]
struct SmallOnCpu<B> {
    device: B,
    min: u64,
    /// Jobs in submission order: `Some(completion)` done on the CPU,
    /// `None` on the device.
    order: std::collections::VecDeque<Option<Completion>>,
    from_device: std::collections::VecDeque<Completion>,
    cpu: Counters,
}

#[cfg(feature = "dpdk")]
impl<B: AsyncCopy> SmallOnCpu<B> {
    fn new(device: B, min: u64) -> Self {
        SmallOnCpu {
            device,
            min,
            order: Default::default(),
            from_device: Default::default(),
            cpu: Counters::default(),
        }
    }
}

#[cfg(feature = "dpdk")]
impl<B: AsyncCopy> AsyncCopy for SmallOnCpu<B> {
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob> {
        let bytes = job.bytes();
        if bytes < self.min {
            for s in &job.segments {
                // SAFETY: the submit contract (valid, non-overlapping).
                unsafe { burst_dsa::CopyEngine::copy(&burst_dsa::CpuCopy, s.dst, s.src, s.len) };
            }
            self.cpu.fallbacks += 1;
            self.order.push_back(Some(Completion {
                tag: job.tag,
                bytes,
                status: Ok(()),
            }));
            return Ok(());
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.device.submit(job) }?;
        self.order.push_back(None);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut got = Vec::new();
        self.device.poll(&mut got);
        self.from_device.extend(got);
        let mut n = 0;
        while let Some(front) = self.order.front() {
            let c = match front {
                Some(c) => *c,
                None => match self.from_device.pop_front() {
                    Some(c) => c,
                    None => break,
                },
            };
            self.order.pop_front();
            out.push(c);
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.order.len()
    }

    fn counters(&self) -> Counters {
        let mut c = self.device.counters();
        c.fallbacks += self.cpu.fallbacks;
        c
    }
}

/// [`DsaEngine`] on the software model of a DSA, the model running on a
/// thread of its own for as long as the backend lives.
struct ModelBackend {
    engine: DsaEngine<ModelPortal>,
    _device: ModelThread,
}

impl ModelBackend {
    fn start(cfg: &CopyConfig) -> io::Result<ModelBackend> {
        let model = DsaModel::new(MODEL_QUEUE);
        model.fault_every(cfg.model_fault_every);
        let device = model.start()?;
        Ok(ModelBackend {
            engine: DsaEngine::new(model.portal(), IN_FLIGHT, cfg.min_offload),
            _device: device,
        })
    }
}

impl AsyncCopy for ModelBackend {
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.engine.submit(job) }
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        self.engine.poll(out)
    }
    fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
    fn counters(&self) -> Counters {
        self.engine.counters()
    }
}
