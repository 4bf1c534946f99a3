//! The kernel's link notifications ([`burst_io::netdev::LinkEvents`]), in
//! a network namespace of the test's own.

use std::os::fd::AsRawFd;
use std::process::Command;

use burst_io::netdev::{link_up, LinkEvents};

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `fd` is readable within `ms` milliseconds.
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

#[test]
fn a_link_going_down_and_up_is_announced() {
    // Namespaces are per thread: this one's.
    std::thread::spawn(in_own_network_namespace)
        .join()
        .expect("test thread");
}

fn in_own_network_namespace() {
    // SAFETY: unshare(2) of this thread's network namespace only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "skipped: no network namespace of our own: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    if !ip("link add bln0 type veth peer name bln1") {
        eprintln!("skipped: cannot make a veth pair (no `ip`?)");
        return;
    }
    let e = LinkEvents::open().expect("rtnetlink socket");
    let fd = e.as_fd_raw();
    // Nothing happened since the subscription.
    assert!(!readable(fd, 0));
    assert!(!e.drain());
    assert!(!e.changed());

    assert!(ip("link set bln0 up") && ip("link set bln1 up"));
    assert!(readable(fd, 5_000), "no notification of the link going up");
    assert!(e.drain());
    assert!(!readable(fd, 0), "drained");
    assert!(e.changed());
    assert!(!e.changed(), "taken once");
    // The carrier follows the administrative state a moment later, with a
    // notification of its own.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while link_up("bln0") != Some(true) {
        assert!(std::time::Instant::now() < deadline, "bln0 never ran");
        assert!(readable(fd, 5_000), "no notification of the carrier");
        assert!(e.drain() && e.changed());
    }

    assert!(ip("link set bln1 down"));
    assert!(
        readable(fd, 5_000),
        "no notification of the peer going down"
    );
    assert!(e.drain() && e.changed());
    // bln0 lost its carrier with its peer.
    assert_eq!(link_up("bln0"), Some(false));
    let _ = ip("link del bln0");
}

trait RawFd {
    fn as_fd_raw(&self) -> i32;
}

impl RawFd for LinkEvents {
    fn as_fd_raw(&self) -> i32 {
        std::os::fd::AsFd::as_fd(self).as_raw_fd()
    }
}
