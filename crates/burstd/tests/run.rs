//! `burst run`: the command sees the kernel's RDMA device files for
//! burst's devices, and nothing outside its mount namespace changes.

use std::path::Path;
use std::process::Command;

#[test]
fn burst_run_gives_the_command_the_device_files_ucx_looks_for() {
    let out = Command::new(env!("CARGO_BIN_EXE_burst"))
        .args(["run", "--", "sh", "-c"])
        .arg(
            "test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 \
             && test -w /dev/infiniband/uverbs0 && test -c /dev/infiniband/rdma_cm \
             && test ! -e /sys/class/infiniband/burst0/ports/1/gids/0 \
             && cat /sys/class/infiniband/burst0/ports/1/gid_attrs/types/1 \
                    /sys/class/infiniband/burst0/ports/1/gids/1 \
                    /sys/class/infiniband/burst0/ports/1/gid_attrs/ndevs/1 \
                    /sys/class/infiniband_verbs/uverbs0/ibdev \
             && ls /sys/class/infiniband/burst0/device/net \
             && test -e /sys/class/infiniband/burst0/device/net/lo/ifindex \
             && test -e /dev/null && test -d /sys/class/net/lo",
        )
        // An address of lo: its GIDs are lo's addresses, laid out as
        // RXE's (index 0, the default GID, is empty: lo has no MAC).
        .env("BURST_ADDR", "127.0.0.1")
        .env_remove("BURST_DAEMON")
        .env_remove("BURST_CONFIG")
        .output()
        .expect("run burst");
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("cannot make a private mount namespace") {
        eprintln!("skipped: {err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "RoCE v2\n0000:0000:0000:0000:0000:ffff:7f00:0001\nlo\nburst0\nlo\n"
    );
    // The rest of the host is as it was.
    if !Path::new("/dev/infiniband").exists() {
        assert!(!Path::new("/sys/class/infiniband").exists());
    }
}

#[test]
fn burst_run_without_a_device_says_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_burst"))
        .args(["run", "--", "true"])
        .env_remove("BURST_ADDR")
        .env_remove("BURST_IFACE")
        .env_remove("BURST_DAEMON")
        .env("BURST_CONFIG", "/nonexistent/burst.toml")
        .env("HOME", "/nonexistent")
        .output()
        .expect("run burst");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("burst:"), "{err}");
}
