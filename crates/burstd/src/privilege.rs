//! What burstd may do, and the checks that keep it from doing more.
//!
//! burstd runs as root to open its port (raw sockets, XDP, DPDK, a bound
//! UDP port) and its socket. Once they are open it keeps only the
//! capabilities an open device still uses and sets `no_new_privs`, so a
//! fault in the daemon cannot be turned into reading or tracing other
//! processes: it holds no `CAP_SYS_PTRACE`, no `CAP_DAC_OVERRIDE`, no
//! `CAP_SYS_ADMIN`. It never needs them for clients: a client's memory
//! reaches it as descriptors the client opened (memfds, or the client's own
//! `/proc/self/mem`), never by pid.

use std::os::fd::{AsRawFd, OwnedFd};

/// `statfs.f_type` of procfs.
const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;

/// Checks that `fd` is what a single-copy registration must come with: a
/// file of procfs open for reading and writing (a client's
/// `/proc/self/mem`). The kernel checked at `open` that its opener may
/// reach that address space, and reads through it reach nothing else; this
/// check only turns a client's mistake into a clear refusal.
pub fn check_self_mem(fd: &OwnedFd) -> Result<(), String> {
    // SAFETY: statfs is plain data; fstatfs writes it for a descriptor we hold.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a live statfs and an open descriptor.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!(
            "memory descriptor: {}",
            std::io::Error::last_os_error()
        ));
    }
    if st.f_type as libc::c_long != PROC_SUPER_MAGIC {
        return Err("the memory descriptor is not the client's /proc/self/mem".into());
    }
    // SAFETY: F_GETFL on an open descriptor; no memory passed.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if fl < 0 || fl & libc::O_ACCMODE != libc::O_RDWR {
        return Err("the memory descriptor must be open for reading and writing".into());
    }
    Ok(())
}

/// Capabilities an open device still uses: raw and admin network access
/// (AF_XDP and DPDK ports, multicast on raw ports), locked memory (UMEMs,
/// DPDK's pages), BPF maps of an attached XDP program.
const KEEP: &[u32] = &[
    10, // CAP_NET_BIND_SERVICE
    12, // CAP_NET_ADMIN
    13, // CAP_NET_RAW
    14, // CAP_IPC_LOCK
    39, // CAP_BPF
];

/// The last capability number this code knows of (`CAP_CHECKPOINT_RESTORE`).
const CAP_LAST: u32 = 40;

/// Drops every capability burstd does not need once its port and socket
/// are open (call it before any other thread starts: capabilities are per
/// thread) (effective, permitted, inheritable and bounding sets) and sets
/// `no_new_privs`; with `user`, also becomes that user (its uid and
/// primary gid, no supplementary groups), keeping the same capabilities.
/// Returns the capabilities kept (empty for a daemon run by an ordinary
/// user, which has none to drop).
pub fn drop_privileges(user: Option<&str>) -> std::io::Result<Vec<u32>> {
    let target = user
        .map(|u| {
            user_ids(u).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no user named {u}"))
            })
        })
        .transpose()?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some((uid, gid)) = target {
        become_user(uid, gid)?;
    }
    let (eff, perm) = capget()?;
    if eff == 0 && perm == 0 {
        return Ok(Vec::new());
    }
    for cap in 0..=CAP_LAST {
        if !KEEP.contains(&cap) {
            // SAFETY: prctl with integer arguments; a capability the kernel
            // does not know (EINVAL) is not in the set anyway.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        }
    }
    let keep = KEEP.iter().fold(0u64, |m, c| m | 1 << c);
    capset(eff & keep, perm & keep)?;
    Ok(KEEP
        .iter()
        .copied()
        .filter(|c| perm & (1 << c) != 0)
        .collect())
}

/// The uid and primary gid of user `name` (from /etc/passwd).
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Becomes `uid`/`gid` with no supplementary groups, keeping the
/// permitted capabilities across the change (PR_SET_KEEPCAPS; the caller
/// then trims them and makes the kept ones effective again).
fn become_user(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: plain system calls with integer arguments (setgroups with an
    // empty list); each result is checked.
    unsafe {
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0
            || libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    // setresuid cleared the effective set; the permitted one stays.
    let (_, perm) = capget()?;
    capset(perm, perm)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two words.
const CAP_V3: u32 = 0x2008_0522;

/// This thread's (effective, permitted) sets.
fn capget() -> std::io::Result<(u64, u64)> {
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: a live header and two data words, as version 3 requires.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    Ok((
        join(d[0].effective, d[1].effective),
        join(d[0].permitted, d[1].permitted),
    ))
}

/// Sets the calling thread's effective and permitted sets (inheritable
/// empty). Capabilities are per thread: burstd calls this before it starts
/// any other thread, and every later thread inherits the reduced sets.
fn capset(eff: u64, perm: u64) -> std::io::Result<()> {
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let d = [
        CapData {
            effective: eff as u32,
            permitted: perm as u32,
            inheritable: 0,
        },
        CapData {
            effective: (eff >> 32) as u32,
            permitted: (perm >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: a live header and two data words, as version 3 requires.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_read_write_procfs_descriptor_passes() {
        let rw: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap()
            .into();
        check_self_mem(&rw).unwrap();
        let ro: OwnedFd = std::fs::File::open("/proc/self/mem").unwrap().into();
        assert!(check_self_mem(&ro).is_err());
        let other: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        assert!(check_self_mem(&other).is_err());
    }
}
