//! `burstd`: serves one burst device to every application on the host.
//!
//! ```text
//! burstd --config /etc/burst/burst.toml
//! burstd --addr 198.18.0.1 --socket /tmp/burstd.sock
//! ```
//! Applications use it with `BURST_DAEMON=/run/burst/burstd.sock` (or
//! `daemon = "..."` in their burst.toml); without it they embed an engine.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;

use burst_verbs::config::Config;
use burst_verbs::engine::{open_ports, Engine, EngineOptions};

/// burst's Verbs service: one device, many applications.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Configuration file (devices and a [burstd] table); default as for
    /// applications (BURST_CONFIG, ~/.config/burst/burst.toml, /etc/burst/burst.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The control socket (default /run/burst/burstd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Permission bits of the socket, octal (default 0660).
    #[arg(long)]
    socket_mode: Option<String>,
    /// Group of the socket.
    #[arg(long)]
    socket_group: Option<String>,
    /// The device's address (instead of the file's devices).
    #[arg(long)]
    addr: Option<String>,
    /// The device's interface (its first address).
    #[arg(long)]
    iface: Option<String>,
    /// Engine threads.
    #[arg(long)]
    threads: Option<u32>,
    /// Packet port: udp, af-xdp, af-xdp-generic, dpdk.
    #[arg(long)]
    port: Option<String>,
}

/// The write end of the pipe the stop signals write to.
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = STOP.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; one byte from a live local.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("burstd: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(c) = &a.config {
        std::env::set_var("BURST_CONFIG", c);
    }
    // burstd serves a device; it is never a client of another burstd.
    std::env::remove_var("BURST_DAEMON");
    for (var, v) in [
        ("BURST_ADDR", &a.addr),
        ("BURST_IFACE", &a.iface),
        ("BURST_PORT", &a.port),
    ] {
        if let Some(v) = v {
            std::env::set_var(var, v);
        }
    }
    if let Some(t) = a.threads {
        std::env::set_var("BURST_THREADS", t.to_string());
    }
    let cfg = Config::from_env()?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BURST_LOG").or_else(|_| {
                tracing_subscriber::EnvFilter::try_new(cfg.log.as_deref().unwrap_or("info"))
            })?,
        )
        .with_writer(std::io::stderr)
        .init();
    let text = std::env::var_os("BURST_CONFIG")
        .map(std::fs::read_to_string)
        .transpose()?
        .unwrap_or_default();
    let mut s = burstd::Settings::from_toml(&text)?;
    if let Some(p) = a.socket {
        s.socket = p;
    }
    if let Some(m) = a.socket_mode {
        s.socket_mode = burstd::settings::parse_mode(&m)?;
    }
    if a.socket_group.is_some() {
        s.socket_group = a.socket_group;
    }
    let dev = cfg
        .devices
        .first()
        .ok_or("no device configured (--addr, --iface, or [[device]] in the config file)")?;
    if cfg.devices.len() > 1 {
        tracing::warn!(
            "burstd serves one device; {} of {} configured are ignored",
            cfg.devices.len() - 1,
            cfg.devices.len()
        );
    }
    let mut o = EngineOptions::for_device(dev);
    o.shared_rings = true;
    let tap = burst_verbs::ports::Tap::new();
    let ports = open_ports(dev)?
        .into_iter()
        .map(|p| {
            Box::new(burst_verbs::ports::CapturePort::new(p, Arc::clone(&tap)))
                as burst_verbs::AnyPort
        })
        .collect();
    let listener = burstd::listen(&s.socket, s.socket_mode, s.socket_group.as_deref())?;
    // Port and socket are open: keep only what an open device uses, before
    // any thread starts (capabilities are per thread; later ones inherit).
    match burstd::privilege::drop_privileges(s.user.as_deref()) {
        Ok(kept) => tracing::info!(
            ?kept,
            "privileges dropped (no_new_privs; capabilities kept)"
        ),
        // Asked to become a user and could not: do not serve as root.
        Err(e) if s.user.is_some() => return Err(format!("burstd: user {:?}: {e}", s.user).into()),
        Err(e) => tracing::warn!("could not drop privileges: {e}"),
    }
    let engine = Engine::with_ports(ports, o)?;
    // SIGTERM / SIGINT: a byte on this pipe ends the accept loop; the
    // engine is then dropped (an XDP program detached, a DPDK port closed)
    // and the socket removed. (SIGKILL leaves an XDP program attached: the
    // next AF_XDP open replaces it.)
    let mut pipe = [0; 2];
    // SAFETY: pipe2 into a live array of two.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: two fresh descriptors we own.
    let (stop_r, _stop_w) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(pipe[0]),
            std::os::fd::OwnedFd::from_raw_fd(pipe[1]),
        )
    };
    STOP.store(pipe[1], std::sync::atomic::Ordering::Relaxed);
    // SAFETY: installs an async-signal-safe handler for the stop signals.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    tracing::info!(
        device = %dev.name,
        addr = %dev.addr,
        socket = %s.socket.display(),
        mode = format!("{:o}", s.socket_mode),
        "burstd serving"
    );
    let daemon = burstd::Daemon::with_limits(engine.context(), tap, s.limits);
    let served = daemon.serve(listener, std::os::fd::AsFd::as_fd(&stop_r));
    tracing::info!("burstd stopping");
    let _ = std::fs::remove_file(&s.socket);
    drop(engine);
    served?;
    // Client threads may still block on their sockets: leave without them
    // (their clients see the socket hang up).
    std::process::exit(0)
}
