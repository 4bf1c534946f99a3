//! What `ibv_reg_mr` costs per MiB in each mode: through burstd with the
//! pages moved onto a shared memfd (remap), through burstd with the
//! single-copy fallback (nothing moved: the daemon uses process_vm_*), and
//! embedded (a table entry). Fresh, touched anonymous memory every time,
//! as an application registers a buffer it has just filled.
//!
//! ```text
//! burstd --addr 127.0.0.1 --socket /tmp/b.sock &
//! cargo run --release -p burstd --example regmr -- /tmp/b.sock 127.0.98.1
//! ```

use std::net::IpAddr;
use std::path::Path;
use std::time::Instant;

use burst_verbs::client::MrMode;
use burst_verbs::engine::{Context, Engine};
use burst_verbs::{Access, Mtu};

/// A fresh anonymous mapping of `len` bytes, every page written.
fn fresh(len: usize) -> *mut u8 {
    // SAFETY: a new private anonymous mapping, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: `len` writable bytes just mapped.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, len) };
    p.cast()
}

/// Mean microseconds per MiB of `reg_mr` (and of `dereg_mr`) over `n`
/// registrations of `mib` MiB.
fn measure(ctx: &Context, mib: usize, n: usize) -> (f64, f64) {
    let len = mib << 20;
    let pd = ctx.try_alloc_pd().expect("pd");
    let (mut reg, mut dereg) = (0.0, 0.0);
    for _ in 0..n {
        let p = fresh(len);
        let t = Instant::now();
        // SAFETY: `p` stays mapped until after the deregistration below.
        let k = unsafe { ctx.reg_mr(pd, p, len, Access(1 | 2 | 4)) }.expect("reg_mr");
        reg += t.elapsed().as_secs_f64();
        let t = Instant::now();
        ctx.dereg_mr(k.lkey).expect("dereg_mr");
        dereg += t.elapsed().as_secs_f64();
        // SAFETY: our mapping, no longer registered.
        unsafe { libc::munmap(p.cast(), len) };
    }
    let per = |s: f64| s * 1e6 / (n * mib) as f64;
    (per(reg), per(dereg))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sock = args.get(1).map_or("/run/burst/burstd.sock", String::as_str);
    let addr: IpAddr = args
        .get(2)
        .map_or("127.0.98.1", String::as_str)
        .parse()
        .expect("an address for the embedded engine");
    let engine = Engine::start(addr, Mtu::Mtu4096).expect("embedded engine");
    let remap = Context::connect_with(Path::new(sock), MrMode::Remap).expect("burstd");
    let copy = Context::connect_with(Path::new(sock), MrMode::Copy).expect("burstd");
    println!("ibv_reg_mr / ibv_dereg_mr, microseconds per MiB (fresh touched memory each time)");
    println!(
        "{:>6} {:>22} {:>22} {:>22}",
        "MiB", "daemon remap", "daemon single-copy", "embedded"
    );
    for (mib, n) in [(1, 50), (16, 10), (64, 5)] {
        let r = measure(&remap, mib, n);
        let c = measure(&copy, mib, n);
        let e = measure(&engine.context(), mib, n);
        println!(
            "{mib:>6} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.2} / {:>9.2}",
            r.0, r.1, c.0, c.1, e.0, e.1
        );
    }
}
