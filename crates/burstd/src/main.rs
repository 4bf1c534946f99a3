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

/// Where the socket is, for the signal handler.
static SOCKET: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    if let Some(p) = SOCKET.get() {
        // SAFETY: unlink and _exit are async-signal-safe; `p` is a static
        // NUL-terminated path.
        unsafe { libc::unlink(p.as_ptr()) };
    }
    // SAFETY: async-signal-safe exit.
    unsafe { libc::_exit(0) };
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
    let mut o = EngineOptions::new(dev.mtu);
    o.name.clone_from(&dev.name);
    o.interface.clone_from(&dev.interface);
    o.drop_every = dev.drop_every;
    o.congestion_control = dev.congestion_control;
    o.port = dev.port;
    o.shared_rings = true;
    let tap = burst_verbs::ports::capture::Tap::new();
    let ports = open_ports(dev)?
        .into_iter()
        .map(|p| {
            Box::new(burst_verbs::ports::capture::CapturePort::new(
                p,
                Arc::clone(&tap),
            )) as burst_verbs::AnyPort
        })
        .collect();
    let engine = Engine::with_ports(ports, o)?;
    let listener = burstd::listen(&s.socket, s.socket_mode, s.socket_group.as_deref())?;
    let _ = SOCKET.set(std::ffi::CString::new(
        s.socket.as_os_str().as_encoded_bytes(),
    )?);
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
    let daemon = burstd::Daemon::new(engine.context(), tap);
    daemon.serve(listener)?;
    Ok(())
}
