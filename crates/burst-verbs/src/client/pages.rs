//! A registration's pages moved onto memfds that burstd maps too (zero
//! copy), and what keeps that true across fork, unmap and remap.

use burst_mem::page_size;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Pages of the application moved onto a memfd (shared with the daemon).
#[derive(Debug)]
struct Area {
    start: usize,
    end: usize,
    memfd: OwnedFd,
    /// The memfd's inode: how /proc/self/maps tells its pages.
    ino: u64,
}

/// A line of /proc/self/maps.
struct Mapping {
    start: usize,
    end: usize,
    perms: String,
    offset: usize,
    ino: u64,
    path: String,
}

fn maps() -> Result<Vec<Mapping>, String> {
    let text = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?.to_owned();
            let offset = usize::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let ino = f.next()?.parse().ok()?;
            let path = f.collect::<Vec<_>>().join(" ");
            Some(Mapping {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                perms,
                offset,
                ino,
                path,
            })
        })
        .collect())
}

impl Area {
    /// Whether the area's pages are still its memfd's, where it mapped
    /// them (the application may have unmapped or freed them since, and
    /// mapped something else there).
    fn is_live(&self, maps: &[Mapping]) -> bool {
        let mut covered = self.start;
        for m in maps
            .iter()
            .filter(|m| m.end > self.start && m.start < self.end)
        {
            if m.start > covered
                || m.ino != self.ino
                || m.offset != m.start.max(self.start) - self.start
            {
                return false;
            }
            covered = m.end;
        }
        covered >= self.end
    }
}

/// Forgets areas whose pages the application unmapped (or replaced).
fn prune(areas: &mut Vec<Area>, maps: &[Mapping]) {
    areas.retain(|a| a.is_live(maps));
}

/// Areas of this process moved onto memfds, for every context (a second
/// registration of the same pages must reuse the memfd: moving them again
/// would leave the first registration on pages the application no longer
/// sees).
static AREAS: Mutex<Vec<Area>> = Mutex::new(Vec::new());

/// A run of pages of a registration and the memfd they live on.
#[derive(Debug)]
pub(crate) struct Piece {
    /// A duplicate of the memfd, for the daemon.
    pub fd: OwnedFd,
    /// Where the run starts in the memfd.
    pub fd_offset: u64,
    /// Bytes (whole pages).
    pub len: u64,
}

/// Moves the pages of `addr..addr+len` onto memfds: pages an earlier
/// registration moved stay on its memfd (moving them again would leave
/// that registration on pages the application no longer sees), the others
/// move onto new ones. Returns the first page's address and the runs of
/// pages in order.
pub(super) fn remap(addr: usize, len: usize) -> Result<(usize, Vec<Piece>), String> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or("range wraps")?
        & !(page - 1);
    let mut areas = AREAS.lock().unwrap_or_else(|e| e.into_inner());
    let maps = maps()?;
    prune(&mut areas, &maps);
    // Check every gap before moving anything: all or nothing.
    let mut gaps = Vec::new();
    let mut at = start;
    while at < end {
        match areas.iter().find(|a| a.start <= at && at < a.end) {
            Some(a) => at = a.end.min(end),
            None => {
                let next = areas
                    .iter()
                    .filter(|a| a.start > at)
                    .map(|a| a.start)
                    .min()
                    .unwrap_or(end)
                    .min(end);
                check_private_anonymous(at, next, &maps)?;
                gaps.push((at, next));
                at = next;
            }
        }
    }
    if gaps.len() + areas.len() > crate::protocol::MAX_FDS * 64 {
        return Err("too many registered areas".into());
    }
    for (s, e) in gaps {
        areas.push(move_pages(s, e)?);
    }
    install_fork_handler();
    let mut pieces = Vec::new();
    let mut at = start;
    while at < end {
        let a = areas
            .iter()
            .find(|a| a.start <= at && at < a.end)
            .ok_or("an area vanished")?;
        let to = a.end.min(end);
        pieces.push(Piece {
            fd: a.memfd.try_clone().map_err(|e| e.to_string())?,
            fd_offset: (at - a.start) as u64,
            len: (to - at) as u64,
        });
        at = to;
    }
    if pieces.len() > crate::protocol::MAX_FDS {
        return Err(format!(
            "the range spans {} earlier registrations (at most {})",
            pieces.len(),
            crate::protocol::MAX_FDS
        ));
    }
    Ok((start, pieces))
}

/// Moves the private anonymous pages `start..end` onto a new memfd.
fn move_pages(start: usize, end: usize) -> Result<Area, String> {
    let size = end - start;
    let memfd = crate::shm::memfd_create("burst-mr").map_err(|e| e.to_string())?;
    // SAFETY: ftruncate on our fresh memfd.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } < 0 {
        return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
    }
    // burstd maps only memfds that cannot shrink under it.
    crate::shm::seal_size(memfd.as_fd()).map_err(|e| format!("seal: {e}"))?;
    // Map the memfd somewhere else first, copy the pages there, then move
    // the mapping over the range in one mremap: the range is never
    // unmapped, and writes other threads make to these pages between the
    // copy and the move are the only ones at risk (see the module docs).
    // SAFETY: a fresh shared mapping of our memfd, chosen by the kernel.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `start..end` is mapped readable (checked in /proc/self/maps)
    // and `tmp` is `size` fresh bytes.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, tmp.cast::<u8>(), size) };
    // The system call itself, not libc's `mremap`: memory hooks that
    // interpose it can lose MREMAP_FIXED's target (UCX's libucm 1.13 passes
    // four arguments on), and the pages land elsewhere while the
    // application keeps writing its old ones.
    // SAFETY: moves our temporary mapping over `start..end`, which holds
    // private anonymous pages of the application that now live in the
    // memfd with the same contents.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            tmp,
            size,
            size,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    } as *mut libc::c_void;
    if moved == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: our temporary mapping, still where mmap put it.
        unsafe { libc::munmap(tmp, size) };
        return Err(format!("mremap: {e}"));
    }
    if moved != start as *mut libc::c_void {
        // SAFETY: the mapping mremap returned is ours alone (`start..end`
        // still holds the application's pages, untouched).
        unsafe { libc::munmap(moved, size) };
        return Err(format!(
            "mremap moved the pages to {moved:p}, not {start:#x}"
        ));
    }
    // SAFETY: a zeroed stat is valid; fstat on our memfd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) };
    Ok(Area {
        start,
        end,
        memfd,
        ino: st.st_ino,
    })
}

/// `Ok` when `start..end` lies in private, anonymous, writable mappings
/// (heap, `malloc`, anonymous `mmap`): the only memory that can move onto
/// a memfd without changing what the application sees.
fn check_private_anonymous(start: usize, end: usize, maps: &[Mapping]) -> Result<(), String> {
    let mut covered = start;
    for m in maps.iter().filter(|m| m.end > start && m.start < end) {
        if m.start > covered {
            return Err("part of the range is not mapped".into());
        }
        if !m.perms.starts_with("rw") || !m.perms.ends_with('p') {
            return Err(format!("a {} mapping (shared or not writable)", m.perms));
        }
        if !(m.path.is_empty() || m.path == "[heap]") {
            return Err(format!("a mapping of {}", m.path));
        }
        covered = m.end;
        if covered >= end {
            return Ok(());
        }
    }
    Err("part of the range is not mapped".into())
}

/// After `fork`, the child's copy of moved pages would still be the
/// memfd, shared with the parent and the daemon; RDMA memory of a forked
/// parent is the parent's alone (rdma-core: the child gets a copy, or, with
/// `ibv_fork_init`, nothing). The child handler gives it private copies.
///
/// The copy is read from pages the parent still writes (they are shared):
/// the parent waits in its handler until the child has its copy, as the
/// kernel copies a pinned page for the child before `fork` returns. A
/// parent that went on at once would change the child's snapshot under it
/// (malloc's chunk headers live in moved heap pages: the child's heap came
/// out corrupted, rdma-core's rdma_cm tests through burstd).
fn install_fork_handler() {
    type Held = Option<(
        std::sync::MutexGuard<'static, Vec<Area>>,
        Option<(OwnedFd, OwnedFd)>,
    )>;
    thread_local! {
        // AREAS, locked by `prepare` across the fork: no registration can
        // move pages between the snapshot and the fork, and the child (the
        // forking thread's copy) owns the lock it inherits. With it, the
        // pipe the child says "copied" on.
        static HELD: std::cell::RefCell<Held> = const { std::cell::RefCell::new(None) };
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn prepare() {
        // In the parent, before the fork (allocating is fine here): the
        // child must only touch areas that are still ours.
        let mut areas = AREAS.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(maps) = maps() {
            prune(&mut areas, &maps);
        }
        let pipe = if areas.is_empty() { None } else { sys::pipe() };
        HELD.with(|h| *h.borrow_mut() = Some((areas, pipe)));
    }
    extern "C" fn parent() {
        let Some((areas, pipe)) = HELD.with(|h| h.borrow_mut().take()) else {
            return;
        };
        if let Some((read, write)) = pipe {
            // Only the child holds a write end now: its byte, or its end
            // (it exited or exec'd; no child at all if fork failed), wakes us.
            drop(write);
            sys::wait_readable(&read);
        }
        drop(areas);
    }
    extern "C" fn child() {
        let Some((mut areas, pipe)) = HELD.with(|h| h.borrow_mut().take()) else {
            return;
        };
        for a in areas.drain(..) {
            sys::make_private(a.start, a.end - a.start);
        }
        if let Some((_read, write)) = pipe {
            sys::say_done(&write);
        }
    }
    ONCE.call_once(|| {
        // SAFETY: registers handlers that read /proc, lock and make a pipe
        // (prepare, in the parent), wait on it (parent), and make system
        // calls and copy memory (the child).
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// The fork handlers' system calls.
mod sys {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A close-on-exec pipe (read end, write end).
    pub(super) fn pipe() -> Option<(OwnedFd, OwnedFd)> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both descriptors are fresh and ours.
        Some(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    }

    /// Blocks until `fd` has a byte or its writers are gone.
    pub(super) fn wait_readable(fd: &OwnedFd) {
        let mut b = 0u8;
        loop {
            // SAFETY: reads one byte into a local.
            let n = unsafe { libc::read(fd.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
            if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Writes the one byte [`wait_readable`] waits for.
    pub(super) fn say_done(fd: &OwnedFd) {
        // SAFETY: writes one byte from a local.
        unsafe { libc::write(fd.as_raw_fd(), b"1".as_ptr().cast(), 1) };
    }

    /// Gives `start..start+size` private pages holding what the shared
    /// ones hold now.
    pub(super) fn make_private(start: usize, size: usize) {
        // SAFETY: an anonymous scratch mapping of `size` bytes.
        let tmp = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if tmp == libc::MAP_FAILED {
            return;
        }
        // SAFETY: copies the shared pages into the scratch mapping, then
        // moves the scratch pages over the range: the child's pages become
        // private with the contents they had at fork.
        unsafe {
            std::ptr::copy_nonoverlapping(start as *const u8, tmp.cast::<u8>(), size);
            libc::mremap(
                tmp,
                size,
                size,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                start as *mut libc::c_void,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Segment;

    #[test]
    fn heap_pages_move_onto_a_memfd_with_their_contents() {
        let page = page_size();
        let mut v = vec![0u8; 3 * page];
        for (i, b) in v.iter_mut().enumerate() {
            *b = i as u8;
        }
        // An unaligned range inside the vector: whole pages move.
        let addr = v.as_ptr() as usize + 100;
        let (start, pieces) = remap(addr, page).unwrap();
        assert_eq!(pieces.len(), 1);
        let fd = pieces.into_iter().next().unwrap().fd;
        assert!(start <= addr);
        assert!(
            v.iter().enumerate().all(|(i, b)| *b == i as u8),
            "contents kept"
        );
        // The memfd shows the application's writes: the same pages.
        let seg = Segment::from_fd(fd, 2 * page).unwrap();
        v[100] = 0xab;
        // SAFETY: in bounds of the mapping (offset < 2 pages).
        let seen = unsafe { *seg.as_ptr().add(addr - start) };
        assert_eq!(seen, 0xab);
        // A second registration inside the same pages reuses the memfd.
        let (start2, _) = remap(addr + 8, 16).unwrap();
        assert_eq!(start2, start);
        // Keep `v` alive past the checks.
        assert_eq!(v[101], 101);
    }

    fn anon(len: usize, at: usize) -> *mut u8 {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at != 0 { libc::MAP_FIXED } else { 0 };
        // SAFETY: an anonymous mapping (at `at`, which the caller owns, if set).
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    #[test]
    fn memory_unmapped_and_mapped_again_gets_a_new_memfd() {
        let len = 4 * page_size();
        let p = anon(len, 0);
        // SAFETY: `len` bytes we just mapped.
        unsafe { std::ptr::write_bytes(p, 1, len) };
        let old = remap(p as usize, len).unwrap().1.remove(0).fd;
        // The application frees the buffer and new memory lands at the same
        // address with other contents. One `MAP_FIXED` replaces the pages
        // atomically: an munmap first would leave a window in which another
        // test thread maps (and later unmaps) this range.
        let q = anon(len, p as usize);
        assert_eq!(q, p);
        // SAFETY: `len` bytes we just mapped.
        unsafe { std::ptr::write_bytes(q, 2, len) };
        let new = remap(q as usize, len).unwrap().1.remove(0).fd;
        let seg = Segment::from_fd(new, len).unwrap();
        // SAFETY: in bounds of the daemon-side view.
        let first = unsafe { *seg.as_ptr() };
        assert_eq!(first, 2, "the new pages, not the old memfd's");
        let old = Segment::from_fd(old, len).unwrap();
        // SAFETY: in bounds.
        assert_eq!(unsafe { *old.as_ptr() }, 1);
        // SAFETY: our mapping.
        unsafe { libc::munmap(q.cast(), len) };
    }

    #[test]
    fn a_forked_child_gets_private_pages() {
        let len = 2 * page_size();
        let p = anon(len, 0);
        // SAFETY: `len` bytes we just mapped.
        unsafe { std::ptr::write_bytes(p, 7, len) };
        let fd = remap(p as usize, len).unwrap().1.remove(0).fd;
        let seg = Segment::from_fd(fd, len).unwrap();
        // SAFETY: fork; the child only reads and writes its memory and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child: its copy of the buffer, then exit.
            unsafe {
                let saw = *p;
                *p = 9; // must not reach the parent or the daemon's view
                libc::_exit(if saw == 7 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child saw the contents at fork"
        );
        // SAFETY: in bounds of both mappings.
        unsafe {
            assert_eq!(*p, 7, "the child's write stayed in the child");
            assert_eq!(*seg.as_ptr(), 7);
            *p = 8;
            assert_eq!(*seg.as_ptr(), 8, "the parent's pages are still shared");
            libc::munmap(p.cast(), len);
        }
    }

    #[test]
    fn the_parent_going_on_after_fork_does_not_reach_the_childs_copy() {
        // A large area takes the child a while to copy; the parent writes
        // its last page the moment fork returns (as a parent's malloc does
        // in moved heap pages). The child must see the page as at fork.
        let len = 64 << 20;
        let p = anon(len, 0);
        // SAFETY: `len` bytes we just mapped.
        unsafe { std::ptr::write_bytes(p, 7, len) };
        let _fd = remap(p as usize, len).unwrap().1.remove(0).fd;
        let last = len - 1;
        // SAFETY: fork; the child reads its copy and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child: its copy of the buffer, then exit.
            unsafe { libc::_exit(if *p.add(last) == 7 { 0 } else { 1 }) };
        }
        // SAFETY: in bounds; the parent's own pages.
        unsafe { *p.add(last) = 9 };
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child saw the parent's write made after fork"
        );
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), len) };
    }

    #[test]
    fn a_range_over_earlier_registrations_is_shared_piece_by_piece() {
        let page = page_size();
        let len = 8 * page;
        let p = anon(len, 0) as usize;
        for i in 0..len {
            // SAFETY: in bounds of our mapping.
            unsafe { *((p + i) as *mut u8) = (i / page) as u8 };
        }
        // Pages 1-2 and 5 registered first, then the whole range.
        remap(p + page + 10, page).unwrap();
        remap(p + 5 * page, 1).unwrap();
        let (start, pieces) = remap(p, len).unwrap();
        assert_eq!(start, p);
        let lens: Vec<u64> = pieces.iter().map(|x| x.len / page as u64).collect();
        assert_eq!(lens, [1, 2, 2, 1, 2], "gap, earlier, gap, earlier, gap");
        let seg = Segment::from_pieces(
            pieces
                .into_iter()
                .map(|x| (x.fd, x.fd_offset, x.len))
                .collect(),
        )
        .unwrap();
        for pg in 0..8 {
            // SAFETY: in bounds of both mappings.
            unsafe {
                assert_eq!(*seg.as_ptr().add(pg * page), pg as u8, "page {pg}");
                *((p + pg * page + 1) as *mut u8) = 0xee;
                assert_eq!(*seg.as_ptr().add(pg * page + 1), 0xee, "page {pg} shared");
            }
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }

    #[test]
    fn file_mappings_are_left_alone() {
        let f = tempfile_with(8192);
        // SAFETY: a private read-only mapping of our own temporary file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(remap(p as usize, 8192).is_err());
        // SAFETY: our mapping.
        unsafe { libc::munmap(p, 8192) };
    }

    fn tempfile_with(len: usize) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("burst-remap-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        f.set_len(len as u64).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
