//! Every backend against a plain copy, and the DSA engine's paths through
//! the device model: batches, a page fault finished on the CPU, refused
//! descriptors, a full work queue, completion order.

use burst_dsa::dsa::model::{DsaModel, ModelPortal};
use burst_dsa::dsa::{opcode, status, CompletionRecord, Descriptor, DsaEngine, Portal};
use burst_dsa::{AsyncCopy, Completion, CopyError, CopyJob, CpuEngine, Segment, SgCheck};
use proptest::prelude::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A job copying each of `srcs` into the same-sized buffer of `dsts`.
fn job(tag: u64, dsts: &mut [Vec<u8>], srcs: &[Vec<u8>]) -> CopyJob {
    CopyJob {
        tag,
        segments: dsts
            .iter_mut()
            .zip(srcs)
            .map(|(d, s)| Segment::between(d, s))
            .collect(),
    }
}

fn dsa(queue: usize) -> (DsaModel, DsaEngine<ModelPortal>) {
    let m = DsaModel::new(queue);
    let e = DsaEngine::new(m.portal(), 64, 0);
    (m, e)
}

#[test]
fn one_segment_is_one_descriptor_completed_by_the_device() {
    let (m, mut e) = dsa(16);
    let src = vec![pattern(4096, 1)];
    let mut dst = vec![vec![0u8; 4096]];
    // SAFETY: the buffers outlive the job (drained below).
    unsafe { e.submit(job(7, &mut dst, &src)).unwrap() };
    let mut out = Vec::new();
    assert_eq!(e.poll(&mut out), 0, "not before the device ran it");
    assert_eq!(m.queued(), 1);
    assert_eq!(m.process(), 1);
    assert_eq!(e.poll(&mut out), 1);
    assert_eq!(
        out,
        [Completion {
            tag: 7,
            bytes: 4096,
            status: Ok(())
        }]
    );
    assert_eq!(dst, src);
}

#[test]
fn several_segments_go_as_one_batch() {
    let (m, mut e) = dsa(16);
    let src: Vec<Vec<u8>> = (0..5).map(|i| pattern(100 + i * 700, i as u8)).collect();
    let mut dst: Vec<Vec<u8>> = src.iter().map(|s| vec![0u8; s.len()]).collect();
    // SAFETY: as above.
    unsafe { e.submit(job(1, &mut dst, &src)).unwrap() };
    assert_eq!(m.queued(), 1, "one portal write for the batch");
    m.process();
    assert_eq!(m.processed(), 6, "the batch and its five MEMMOVEs");
    let mut out = Vec::new();
    e.drain(&mut out);
    assert_eq!(out[0].status, Ok(()));
    assert_eq!(dst, src);
}

#[test]
fn a_page_fault_is_finished_on_the_cpu_from_where_the_device_stopped() {
    let (m, mut e) = dsa(16);
    let src = vec![pattern(8192, 3)];
    let mut dst = vec![vec![0u8; 8192]];
    m.fault_next(1000);
    // SAFETY: as above.
    unsafe { e.submit(job(2, &mut dst, &src)).unwrap() };
    m.process();
    let mut out = Vec::new();
    e.drain(&mut out);
    assert_eq!(out[0].status, Ok(()));
    assert_eq!(dst, src);
    let c = e.counters();
    assert_eq!((c.faults, c.fallbacks, c.jobs, c.bytes), (1, 1, 1, 8192));

    // Inside a batch: the batch says BATCH_FAIL, the faulted entry is
    // finished, the others are the device's.
    let src: Vec<Vec<u8>> = (0..3).map(|i| pattern(5000, 10 + i)).collect();
    let mut dst: Vec<Vec<u8>> = src.iter().map(|s| vec![0u8; s.len()]).collect();
    m.fault_next(4095);
    // SAFETY: as above.
    unsafe { e.submit(job(3, &mut dst, &src)).unwrap() };
    m.process();
    out.clear();
    e.drain(&mut out);
    assert_eq!(out[0].status, Ok(()));
    assert_eq!(dst, src);
    assert_eq!(e.counters().faults, 2);
}

#[test]
fn refused_descriptors_complete_with_the_device_status() {
    let (m, mut e) = dsa(16);
    // Overlapping buffers: the device's OVERLAP_BUFFERS.
    let mut buf = pattern(4096, 5);
    let p = buf.as_mut_ptr();
    let j = CopyJob {
        tag: 9,
        segments: vec![Segment {
            // SAFETY: both ends inside `buf`.
            dst: unsafe { p.add(100) },
            src: p,
            len: 1000,
        }],
    };
    // SAFETY: `buf` outlives the job; the overlap is what is tested (the
    // device checks it before touching memory).
    unsafe { e.submit(j).unwrap() };
    m.process();
    let mut out = Vec::new();
    e.drain(&mut out);
    assert_eq!(
        out[0].status,
        Err(CopyError::Device(status::OVERLAP_BUFFERS))
    );
    assert_eq!(e.counters().errors, 1);
    assert_eq!(buf, pattern(4096, 5), "nothing moved");

    // An unknown operation, straight to the portal.
    let rec = Box::new(CompletionRecord::default());
    let d = Descriptor {
        completion_addr: std::ptr::from_ref(&*rec) as u64,
        ..Descriptor::new(0x7f, 0x0c)
    };
    // SAFETY: `rec` lives until the record is written (process below).
    assert!(unsafe { m.portal().submit(&d) });
    m.process();
    assert_eq!(rec.status(), Some(status::BAD_OPCODE));
    // A batch of one descriptor: DESC_CNT_ERR.
    let list = [Descriptor::new(opcode::NOOP, 0); 1];
    let d = Descriptor {
        completion_addr: std::ptr::from_ref(&*rec) as u64,
        src: list.as_ptr() as u64,
        size: 1,
        ..Descriptor::new(opcode::BATCH, 0x0c)
    };
    rec.status.store(0, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: as above; `list` lives too.
    assert!(unsafe { m.portal().submit(&d) });
    m.process();
    assert_eq!(rec.status(), Some(status::DESC_CNT_ERR));
}

#[test]
fn a_full_work_queue_hands_the_job_back_until_the_device_drains() {
    let (m, mut e) = dsa(2);
    let src: Vec<Vec<u8>> = (0..3).map(|i| pattern(512, i)).collect();
    let mut dst: Vec<Vec<u8>> = src.iter().map(|s| vec![0u8; s.len()]).collect();
    let mut jobs: Vec<CopyJob> = dst
        .iter_mut()
        .zip(&src)
        .enumerate()
        .map(|(i, (d, s))| CopyJob {
            tag: i as u64,
            segments: vec![Segment::between(d, s)],
        })
        .collect();
    let third = jobs.pop().unwrap();
    for j in jobs {
        // SAFETY: the buffers outlive the jobs.
        unsafe { e.submit(j).unwrap() };
    }
    // SAFETY: as above.
    let back = unsafe { e.submit(third) }.expect_err("the queue holds two");
    assert_eq!(back.tag, 2, "the same job, to retry");
    assert_eq!(e.counters().full, 1);
    m.process();
    // SAFETY: as above.
    unsafe { e.submit(back).unwrap() };
    m.process();
    let mut out = Vec::new();
    e.drain(&mut out);
    assert_eq!(out.iter().map(|c| c.tag).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(dst, src);
}

#[test]
fn completions_keep_submission_order_across_cpu_and_device() {
    let m = DsaModel::new(16);
    // Jobs under 1 KiB are the CPU's.
    let mut e = DsaEngine::new(m.portal(), 16, 1024);
    let src = [vec![pattern(4096, 1)], vec![pattern(64, 2)]];
    let mut d0 = vec![vec![0u8; 4096]];
    let mut d1 = vec![vec![0u8; 64]];
    // SAFETY: the buffers outlive the jobs.
    unsafe {
        e.submit(job(10, &mut d0, &src[0])).unwrap();
        e.submit(job(11, &mut d1, &src[1])).unwrap();
    }
    assert_eq!(d1, src[1], "the small one is done at once ...");
    let mut out = Vec::new();
    assert_eq!(e.poll(&mut out), 0, "... but reported after the first");
    m.process();
    e.drain(&mut out);
    assert_eq!(out.iter().map(|c| c.tag).collect::<Vec<_>>(), [10, 11]);
    assert_eq!(e.counters().fallbacks, 1);
}

/// A random scatter-gather job: segment lengths and both sides' offsets.
fn sg() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
    proptest::collection::vec((0usize..9000, 0usize..64, 0usize..64), 1..6)
}

/// Runs `segs` through `engine` (the model stepped by `step`) and checks
/// the bytes against a plain copy.
fn check_backend(
    engine: &mut dyn AsyncCopy,
    step: &dyn Fn(),
    segs: &[(usize, usize, usize)],
) -> Result<(), TestCaseError> {
    let mut check = SgCheck::new(segs, 0);
    // SAFETY: `check` holds the buffers past the drain below.
    unsafe {
        engine
            .submit(check.job(5))
            .map_err(|_| TestCaseError::fail("refused"))?
    };
    step();
    let mut out = Vec::new();
    engine.drain(&mut out);
    prop_assert_eq!(out.len(), 1);
    prop_assert_eq!(out[0].status, Ok(()));
    check.verify().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #[test]
    fn cpu_engine_copies_like_a_plain_copy(segs in sg()) {
        let mut e = CpuEngine::new(4);
        check_backend(&mut e, &|| {}, &segs)?;
    }

    #[test]
    fn dsa_engine_on_the_model_copies_like_a_plain_copy(
        segs in sg(),
        fault in proptest::option::of(0u32..9000),
    ) {
        let (m, mut e) = dsa(8);
        if let Some(f) = fault {
            m.fault_next(f);
        }
        check_backend(&mut e, &|| { m.process(); }, &segs)?;
    }

    #[test]
    fn the_model_on_its_own_thread_copies_like_a_plain_copy(
        segs in sg(),
        fault_every in 0u64..4,
    ) {
        // The device runs beside the submitter (as the data plane uses it).
        let m = DsaModel::new(8);
        m.fault_every(fault_every);
        let _device = m.start().unwrap();
        let mut e = DsaEngine::new(m.portal(), 64, 0);
        check_backend(&mut e, &|| {}, &segs)?;
    }
}
