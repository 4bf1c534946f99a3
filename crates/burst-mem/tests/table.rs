//! Registration, keys, checks and safe deregistration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_mem::*;
use burst_transport::{AtomicOp, MemError, Memory, QpScope, RemoteAccess, Sge};
use burst_wire::Qpn;

/// A QP of `pd` (QP 1: these tests use memory regions, which serve every QP of the PD).
fn qp(pd: u32) -> QpScope {
    QpScope {
        pd,
        qpn: Qpn::from_wire(1),
    }
}

fn reg(t: &MrTable, pd: Pd, buf: &mut [u8], access: Access) -> MrKeys {
    // SAFETY: every test keeps its buffer alive past deregistration or the
    // end of the table's use.
    unsafe { t.register(pd, buf.as_mut_ptr(), buf.len(), buf.as_ptr() as u64, access) }.unwrap()
}

#[test]
fn keys_are_fresh_random_32_bit_values() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let mut buf = vec![0u8; 64];
    let mut seen = std::collections::HashSet::new();
    let mut last = None;
    let mut bits_set = 0u32;
    let mut bits_clear = 0u32;
    for _ in 0..200 {
        let k = reg(&t, pd, &mut buf, Access::LOCAL_WRITE);
        assert_eq!(k.rkey, k.lkey, "one key, as RXE and mlx5 give");
        assert_ne!(k.lkey, 0);
        if let Some(prev) = last {
            // a stale key misses
            assert_ne!(k.lkey, prev);
            assert!(t.lookup(prev).is_none());
        }
        assert!(seen.insert(k.lkey), "a key came back: {:#x}", k.lkey);
        bits_set |= k.lkey;
        bits_clear |= !k.lkey;
        t.deregister(k.lkey).unwrap();
        assert_eq!(t.deregister(k.lkey), Err(RegError::NoSuchRegion));
        last = Some(k.lkey);
    }
    // Every one of the 32 bits varies over 200 keys (a fixed index or tag
    // part would leave bits constant).
    assert_eq!(bits_set & bits_clear, u32::MAX, "constant key bits");
    assert!(t.is_empty());
}

#[test]
fn verbs_rules_on_access_and_length() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let mut buf = vec![0u8; 64];
    // SAFETY: buf outlives the table's use.
    let r = unsafe { t.register(pd, buf.as_mut_ptr(), 64, 0, Access::REMOTE_WRITE) };
    assert_eq!(r, Err(RegError::InvalidAccess));
    // SAFETY: as above.
    let r = unsafe { t.register(pd, buf.as_mut_ptr(), 0, 0, Access::LOCAL_WRITE) };
    assert_eq!(r, Err(RegError::InvalidLength));
    assert_eq!(RegError::InvalidAccess.errno(), 22);
    let ok = reg(
        &t,
        pd,
        &mut buf,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::RELAXED_ORDERING,
    );
    assert_eq!(ok.rkey, ok.lkey);
}

#[test]
fn remote_checks_bounds_pd_and_rights() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let other = t.alloc_pd();
    let mut buf = vec![0u8; 4096];
    let k = reg(&t, pd, &mut buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let m = t.memory();
    m.check_remote(qp(pd.0), k.rkey, k.addr, 4096, RemoteAccess::Read)
        .unwrap();
    assert_eq!(
        m.check_remote(qp(pd.0), k.rkey, k.addr + 1, 4096, RemoteAccess::Read),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        m.check_remote(qp(pd.0), k.rkey, k.addr - 1, 1, RemoteAccess::Read),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        m.check_remote(qp(pd.0), k.rkey, u64::MAX, 2, RemoteAccess::Read),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        m.check_remote(qp(other.0), k.rkey, k.addr, 8, RemoteAccess::Read),
        Err(MemError::PdMismatch)
    );
    assert_eq!(
        m.check_remote(qp(pd.0), k.rkey, k.addr, 8, RemoteAccess::Write),
        Err(MemError::NoAccess)
    );
    assert_eq!(
        m.check_remote(qp(pd.0), k.rkey ^ 0x1, k.addr, 8, RemoteAccess::Read),
        Err(MemError::BadKey(k.rkey ^ 1))
    );
}

#[test]
fn data_moves_in_place_through_sges_and_iova() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let mut a = vec![0u8; 100];
    let mut b = vec![0u8; 100];
    let ka = reg(
        &t,
        pd,
        &mut a,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );
    // a region addressed by an IOVA unrelated to its host address
    // SAFETY: b outlives the table's use.
    let kb = unsafe {
        t.register(
            pd,
            b.as_mut_ptr(),
            100,
            0x1000,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
    }
    .unwrap();
    let mut m = t.memory();
    let sges = [
        Sge {
            addr: ka.addr + 90,
            length: 10,
            lkey: ka.lkey,
        },
        Sge {
            addr: 0x1000,
            length: 20,
            lkey: kb.lkey,
        },
    ];
    let data: Vec<u8> = (1..=30).collect();
    m.write_local(pd.0, &sges, 0, &data).unwrap();
    let mut out = [0u8; 30];
    m.read_local(pd.0, &sges, 0, &mut out).unwrap();
    assert_eq!(&out[..], &data[..]);
    m.write_remote(kb.rkey, 0x1000 + 50, b"xyz").unwrap();
    assert!(
        m.write_local(pd.0, &sges, 25, &[0; 6]).is_err(),
        "past the SGE list"
    );
    assert_eq!(&a[90..], &data[..10]);
    assert_eq!(&b[..20], &data[10..]);
    assert_eq!(&b[50..53], b"xyz");
}

#[test]
fn atomics_execute_on_application_memory() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let mut cell = vec![0u64; 2];
    // SAFETY: `cell` outlives the table's use.
    let k = unsafe {
        t.register(
            pd,
            cell.as_mut_ptr().cast(),
            16,
            0x8000,
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        )
    }
    .unwrap();
    let mut m = t.memory();
    assert_eq!(
        m.atomic(qp(pd.0), k.rkey, 0x8000, AtomicOp::FetchAdd { add: 5 }),
        Ok(0)
    );
    assert_eq!(
        m.atomic(
            qp(pd.0),
            k.rkey,
            0x8000,
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 9
            }
        ),
        Ok(5)
    );
    assert_eq!(
        m.atomic(
            qp(pd.0),
            k.rkey,
            0x8000,
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 1
            }
        ),
        Ok(9)
    );
    assert_eq!(
        m.atomic(qp(pd.0), k.rkey, 0x8004, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::Misaligned)
    );
    assert_eq!(
        m.atomic(qp(pd.0), k.rkey, 0x800c, AtomicOp::FetchAdd { add: 1 }),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(cell[0], 9);
}

#[test]
fn deregistration_waits_for_in_flight_operations() {
    let t = Arc::new(MrTable::new());
    let pd = t.alloc_pd();
    let mut buf = vec![0u8; 64];
    let k = reg(&t, pd, &mut buf, Access::LOCAL_WRITE);
    let held = t.lookup(k.lkey).unwrap(); // an operation in flight
    let t2 = Arc::clone(&t);
    let start = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    t2.deregister(k.lkey).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "returned while the region was in use"
    );
    releaser.join().unwrap();
    assert!(t.lookup(k.lkey).is_none());
}

/// Every local access carries the QP's PD: a gather (an inline send the
/// engine reads for a client, a SEND's payload) or a placement through
/// another PD's key reaches nothing, whatever that region's rights.
#[test]
fn local_gathers_and_placements_check_the_pd() {
    let t = MrTable::new();
    let (mine, theirs) = (t.alloc_pd(), t.alloc_pd());
    let mut secret = vec![0x5au8; 64];
    let k = reg(
        &t,
        theirs,
        &mut secret,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let sges = [Sge {
        addr: k.addr,
        length: 64,
        lkey: k.lkey,
    }];
    let mut m = t.memory();
    let mut out = [0u8; 64];
    assert_eq!(
        m.read_local(mine.0, &sges, 0, &mut out),
        Err(MemError::PdMismatch)
    );
    assert_eq!(out, [0u8; 64], "nothing of the other PD's region copied");
    assert_eq!(
        m.read_local_crc(mine.0, &sges, 0, &mut out),
        Err(MemError::PdMismatch)
    );
    assert_eq!(
        m.write_local(mine.0, &sges, 0, &[1; 64]),
        Err(MemError::PdMismatch)
    );
    assert_eq!(secret, vec![0x5au8; 64]);
    // The owner's PD reaches it.
    m.read_local(theirs.0, &sges, 0, &mut out).unwrap();
    assert_eq!(out, [0x5au8; 64]);
}

#[test]
fn a_reregistration_keeps_the_keys_and_takes_the_new_pd_range_and_rights() {
    let t = MrTable::new();
    let pd = t.alloc_pd();
    let other = t.alloc_pd();
    let mut buf = vec![0u8; 4096];
    let mut moved = vec![0u8; 8192];
    let k = reg(&t, pd, &mut buf, Access::LOCAL_WRITE);
    assert_eq!(k.rkey, k.lkey);
    assert_eq!(
        t.memory()
            .check_remote(qp(pd.0), k.rkey, k.addr, 8, RemoteAccess::Read),
        Err(MemError::NoAccess),
        "no remote right: the key is refused"
    );
    // Remote write and another PD, then another range: the keys stay.
    let n = reg(
        &t,
        other,
        &mut buf,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let r = t.replace(k.lkey, n.lkey).unwrap();
    assert_eq!((r.lkey, r.rkey), (k.lkey, k.lkey));
    assert!(
        t.lookup(n.lkey).is_none(),
        "the new registration's key is gone"
    );
    assert_eq!(t.len(), 1);
    let m = t.memory();
    m.check_remote(qp(other.0), r.rkey, k.addr, 4096, RemoteAccess::Write)
        .unwrap();
    assert_eq!(
        m.check_remote(qp(pd.0), r.rkey, k.addr, 8, RemoteAccess::Write),
        Err(MemError::PdMismatch)
    );
    let n = reg(
        &t,
        other,
        &mut moved,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let r = t.replace(k.lkey, n.lkey).unwrap();
    assert_eq!(
        (r.lkey, r.addr, r.len),
        (k.lkey, moved.as_ptr() as u64, 8192)
    );
    assert_eq!(
        m.check_remote(qp(other.0), r.rkey, k.addr, 8, RemoteAccess::Write),
        Err(MemError::OutOfBounds),
        "the old range is no longer reachable"
    );
    // Unknown keys, and a key replacing itself, are refused.
    assert_eq!(t.replace(k.lkey, k.lkey ^ 1), Err(RegError::NoSuchRegion));
    assert_eq!(t.replace(k.lkey, k.lkey), Err(RegError::NoSuchRegion));
    t.deregister(k.lkey).unwrap();
    assert!(t.is_empty());
}
