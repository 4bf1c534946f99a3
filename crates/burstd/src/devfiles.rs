//! The kernel's RDMA device files for burst's devices, in a private mount
//! namespace, so that software which looks for them before it calls
//! `ibv_get_device_list` runs on burst without a kernel module.
//!
//! UCX, for one, lists an IB device only when `/dev/infiniband/<dev_name>`
//! is a character device it may open, and takes a GID's RoCE version from
//! `/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<index>` (RoCE v1
//! when the file is missing, so that it never reaches a RoCE v2 peer such
//! as RXE). [`enter`] gives the calling process (and what it executes) a
//! view with:
//!
//! - `/dev/infiniband/uverbsN` and `/dev/infiniband/rdma_cm`: `/dev/null`
//!   bound over them (a harmless character device: burst's libibverbs never
//!   opens them, software that checks them finds them);
//! - `/sys/class/infiniband/<dev>/`: node type, GUIDs, and port 1's state,
//!   link layer, and its GID table (each entry with its type, `RoCE v2`,
//!   and network device), as the device lists it when it opens, and
//!   `device/net/<netdev>` (a link to the interface's directory);
//! - `/sys/class/infiniband_verbs/`: the ABI version and `uverbsN/ibdev`.
//!
//! Nothing outside the namespace changes. Where a directory is missing
//! (no `/dev/infiniband` without the RDMA modules), its parent is covered
//! by a tmpfs that binds back every entry of the original, so the rest of
//! `/dev` and `/sys/class` stays as it was. Needs root (CAP_SYS_ADMIN) or
//! unprivileged user namespaces.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};

use burst_verbs::config::{DeviceConfig, PortKind};

/// What one device's files say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFiles {
    /// `ibv_get_device_name` (`burst0`).
    pub name: String,
    /// Its index in the device list: `/dev/infiniband/uverbs<index>`.
    pub index: usize,
    /// The device's own GID (its address).
    pub gid: [u8; 16],
    /// The GID table as the device lists it (`None`: an empty slot).
    pub gids: Vec<Option<[u8; 16]>>,
    /// The network device behind port 1, when known.
    pub netdev: Option<String>,
}

impl DeviceFiles {
    /// The files of each configured device, in the drop-in library's order.
    pub fn for_devices(devices: &[DeviceConfig]) -> Vec<DeviceFiles> {
        devices
            .iter()
            .enumerate()
            .map(|(index, d)| {
                // The device's table when it opens (one engine thread on
                // the UDP port serves every address of its interface).
                let mut t = burst_verbs::gids::GidTable::for_address(d.addr);
                if let (Some(iface), 1, PortKind::Udp) = (&d.interface, d.threads, d.port) {
                    t.follow(d.addr, iface);
                }
                DeviceFiles {
                    name: d.name.clone(),
                    index,
                    gid: burst_verbs::gid_of(d.addr),
                    gids: t
                        .slots()
                        .iter()
                        .map(|g| g.map(burst_verbs::gid_of))
                        .collect(),
                    netdev: d.interface.clone(),
                }
            })
            .collect()
    }

    /// The files under `/sys/class/infiniband/<name>/`, as (relative path,
    /// contents) pairs, in sysfs's formats.
    pub fn sysfs_files(&self) -> Vec<(String, String)> {
        let g = self.gid;
        let guid = format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]
        );
        let mut f = vec![
            ("node_type".into(), "1: CA".into()),
            ("node_guid".into(), guid.clone()),
            ("sys_image_guid".into(), guid),
            ("node_desc".into(), format!("burst {}", self.name)),
            ("fw_ver".into(), env!("CARGO_PKG_VERSION").into()),
            ("ports/1/state".into(), "4: ACTIVE".into()),
            ("ports/1/phys_state".into(), "5: LinkUp".into()),
            ("ports/1/link_layer".into(), "Ethernet".into()),
            ("ports/1/lid".into(), "0x0".into()),
            ("ports/1/sm_lid".into(), "0x0".into()),
        ];
        for (i, g) in self.gids.iter().enumerate() {
            let Some(g) = g else { continue };
            let gid = g
                .chunks(2)
                .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
                .collect::<Vec<_>>()
                .join(":");
            f.push((format!("ports/1/gids/{i}"), gid));
            f.push((format!("ports/1/gid_attrs/types/{i}"), "RoCE v2".into()));
            if let Some(n) = &self.netdev {
                f.push((format!("ports/1/gid_attrs/ndevs/{i}"), n.clone()));
            }
        }
        f
    }
}

/// Why the view could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DevFilesError {
    /// No mount namespace of our own.
    #[error(
        "cannot make a private mount namespace ({0}): run as root, or allow \
         unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
    )]
    Namespace(io::Error),
    /// A mount or file operation failed.
    #[error("{what} {path}: {err}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        err: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DevFilesError + 'a {
    move |err| DevFilesError::Io {
        what,
        path: path.to_path_buf(),
        err,
    }
}

/// Moves the calling process into a private mount namespace holding the
/// device files of `devices` (see the module's documentation). Call it in
/// a single-threaded process, before executing the application.
pub fn enter(devices: &[DeviceFiles]) -> Result<(), DevFilesError> {
    sys::private_namespace().map_err(DevFilesError::Namespace)?;
    let ib = cover(Path::new("/dev/infiniband"))?;
    let null = Path::new("/dev/null");
    for name in devices
        .iter()
        .map(|d| format!("uverbs{}", d.index))
        .chain(["rdma_cm".to_string()])
    {
        let p = ib.join(name);
        fs::write(&p, b"").map_err(io_err("create", &p))?;
        sys::bind(null, &p, false).map_err(io_err("bind /dev/null over", &p))?;
    }
    let class = cover(Path::new("/sys/class/infiniband"))?;
    let verbs = cover(Path::new("/sys/class/infiniband_verbs"))?;
    write(&verbs.join("abi_version"), "6")?;
    for d in devices {
        for (rel, text) in d.sysfs_files() {
            write(&class.join(&d.name).join(rel), &text)?;
        }
        // `device/net/<netdev>`, as the kernel's RoCE devices have: how
        // rdma-core's tests, UCX and `ibdev2netdev` find the interface.
        if let Some(n) = &d.netdev {
            let dir = class.join(&d.name).join("device/net");
            fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
            let link = dir.join(n);
            symlink(Path::new("/sys/class/net").join(n), &link)
                .map_err(io_err("create link", &link))?;
        }
        let u = verbs.join(format!("uverbs{}", d.index));
        write(&u.join("ibdev"), &d.name)?;
        write(&u.join("abi_version"), "1")?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), DevFilesError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    }
    fs::write(path, format!("{text}\n")).map_err(io_err("write", path))
}

/// An empty tmpfs at `dir`: over it when it exists, else in a tmpfs over
/// its parent that binds back every entry the parent had.
fn cover(dir: &Path) -> Result<PathBuf, DevFilesError> {
    if !dir.is_dir() {
        let parent = dir.parent().unwrap_or(Path::new("/"));
        rebuild(parent)?;
        fs::create_dir(dir).map_err(io_err("create", dir))?;
    }
    sys::tmpfs(dir).map_err(io_err("mount tmpfs on", dir))?;
    Ok(dir.to_path_buf())
}

/// Covers `dir` with a tmpfs and binds each of its entries back (through a
/// descriptor of the covered directory, which still reaches them).
fn rebuild(dir: &Path) -> Result<(), DevFilesError> {
    let old: OwnedFd = fs::File::open(dir).map_err(io_err("open", dir))?.into();
    let entries: Vec<_> = fs::read_dir(dir)
        .map_err(io_err("read", dir))?
        .filter_map(Result::ok)
        .collect();
    sys::tmpfs(dir).map_err(io_err("mount tmpfs on", dir))?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    for e in entries {
        let name = e.file_name();
        let (src, dst) = (via.join(&name), dir.join(&name));
        let Ok(t) = e.file_type() else { continue };
        if t.is_symlink() {
            let target = fs::read_link(&src).map_err(io_err("read link", &src))?;
            symlink(&target, &dst).map_err(io_err("create link", &dst))?;
        } else if t.is_dir() {
            fs::create_dir(&dst).map_err(io_err("create", &dst))?;
            sys::bind(&src, &dst, true).map_err(io_err("bind", &dst))?;
        } else if t.is_file() || t.is_char_device() || t.is_block_device() || t.is_fifo() {
            fs::write(&dst, b"").map_err(io_err("create", &dst))?;
            sys::bind(&src, &dst, false).map_err(io_err("bind", &dst))?;
        }
        // Sockets are left out: a bound socket file cannot be re-bound.
    }
    Ok(())
}

/// The system calls, each in one place.
mod sys {
    use super::*;

    fn path_c(p: &Path) -> io::Result<CString> {
        use std::os::unix::ffi::OsStrExt;
        CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
    }

    fn check(r: libc::c_int) -> io::Result<()> {
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// A mount namespace of our own whose mounts do not propagate back;
    /// without the privilege, inside a user namespace that maps us to
    /// ourselves.
    pub fn private_namespace() -> io::Result<()> {
        // SAFETY: unshare takes flags only.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            let (uid, gid) = (
                // SAFETY: getuid/getgid cannot fail.
                unsafe { libc::getuid() },
                // SAFETY: as above.
                unsafe { libc::getgid() },
            );
            // SAFETY: as above.
            check(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) })?;
            fs::write("/proc/self/setgroups", "deny")?;
            fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
            fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
        }
        let root = path_c(Path::new("/"))?;
        // SAFETY: valid C strings; null fs type and data are allowed for a
        // propagation change.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })
    }

    pub fn tmpfs(dir: &Path) -> io::Result<()> {
        let (d, t) = (path_c(dir)?, c"tmpfs");
        let opts = c"mode=755";
        // SAFETY: valid C strings for source, target, type and data.
        check(unsafe {
            libc::mount(
                t.as_ptr(),
                d.as_ptr(),
                t.as_ptr(),
                libc::MS_NOSUID,
                opts.as_ptr().cast(),
            )
        })
    }

    pub fn bind(src: &Path, dst: &Path, recursive: bool) -> io::Result<()> {
        let (s, d) = (path_c(src)?, path_c(dst)?);
        let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
        // SAFETY: valid C strings; a bind mount takes no type or data.
        check(unsafe {
            libc::mount(
                s.as_ptr(),
                d.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_files_say_roce_v2_and_the_gid_in_sysfs_format() {
        let d = DeviceFiles {
            name: "burst0".into(),
            index: 0,
            gid: burst_verbs::gid_of("198.18.0.131".parse().unwrap()),
            gids: vec![
                None,
                Some(burst_verbs::gid_of("198.18.0.131".parse().unwrap())),
            ],
            netdev: Some("veth0".into()),
        };
        let f: std::collections::HashMap<_, _> = d.sysfs_files().into_iter().collect();
        assert!(
            !f.contains_key("ports/1/gids/0"),
            "an empty slot has no file"
        );
        assert_eq!(f["ports/1/gid_attrs/types/1"], "RoCE v2");
        assert_eq!(f["ports/1/gid_attrs/ndevs/1"], "veth0");
        assert_eq!(
            f["ports/1/gids/1"],
            "0000:0000:0000:0000:0000:ffff:c612:0083"
        );
        assert_eq!(f["ports/1/link_layer"], "Ethernet");
        assert_eq!(f["node_guid"], "0000:ffff:c612:0083");
    }
}
