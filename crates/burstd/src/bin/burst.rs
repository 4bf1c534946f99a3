//! `burst`: look at a running burstd, in the spirit of `rdma` and
//! `ibv_devinfo`.
//!
//! ```text
//! burst dev                      # the device and its port
//! burst clients                  # applications and their objects
//! burst stat                     # device counters (RXE's names)
//! burst stat --qp 0x12           # one QP's counters
//! burst capture -w out.pcapng -c 1000   # live capture (root)
//! burst run -- ucx_info -d       # a command that wants /dev/infiniband
//! ```
//! The socket is `--socket`, else `BURST_DAEMON`, else /run/burst/burstd.sock.

use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use burst_verbs::engine::Context;
use burst_verbs::protocol::{Reply, Request};

/// Inspect a burstd.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// burstd's control socket.
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// The device and its port.
    Dev,
    /// Connected applications and the objects each owns.
    Clients,
    /// Counters: the device's, or one QP's.
    Stat {
        /// A QP number (decimal or 0x hex).
        #[arg(long)]
        qp: Option<String>,
    },
    /// Capture the device's packets to a pcapng file (`-` for stdout).
    Capture {
        /// Where to write.
        #[arg(short = 'w', long)]
        write: PathBuf,
        /// Packets to capture.
        #[arg(short = 'c', long, default_value_t = 1000)]
        count: u64,
    },
    /// Run a command with the kernel's RDMA device files for burst's
    /// devices (`/dev/infiniband/uverbsN`, `/sys/class/infiniband/<dev>`), in a
    /// private mount namespace: what UCX looks for before it uses a device.
    /// The devices are burstd's with --socket or BURST_DAEMON, else those
    /// BURST_ADDR, BURST_IFACE or the configuration file name. Needs root or
    /// unprivileged user namespaces.
    Run {
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
}

fn main() {
    // Like the C tools: a reader that stops early (`| head`) ends us quietly.
    // SAFETY: restores the default action of one signal.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let a = Args::parse();
    if let Err(e) = run(a) {
        eprintln!("burst: {e}");
        std::process::exit(1);
    }
}

fn socket(a: &Args) -> PathBuf {
    a.socket
        .clone()
        .or_else(|| std::env::var_os("BURST_DAEMON").map(PathBuf::from))
        .unwrap_or_else(burstd::default_socket)
}

fn ask(ctx: &Context, req: &Request) -> Result<Reply, String> {
    match ctx.daemon_request(req, &[]) {
        Ok((Reply::Error { message, .. }, _)) => Err(message),
        Ok((r, _)) => Ok(r),
        Err(e) => Err(e.to_string()),
    }
}

/// A counters struct as `name value` lines, nested structs flattened.
fn counter_lines(v: &serde_json::Value, prefix: &str, out: &mut String) {
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            let name = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                serde_json::Value::Object(_) => counter_lines(v, &name, out),
                other => out.push_str(&format!("{name:<40} {other}\n")),
            }
        }
    }
}

/// `burst run`: the device files, then the command in our place.
fn run_with_device_files(a: &Args, command: &[std::ffi::OsString]) -> Result<(), String> {
    let daemon = a.socket.is_some() || std::env::var_os("BURST_DAEMON").is_some();
    let devices = if daemon {
        let ctx = Context::connect(&socket(a)).map_err(|e| e.to_string())?;
        vec![ctx.config().clone()]
    } else {
        burst_verbs::config::Config::from_env()
            .map_err(|e| e.to_string())?
            .devices
    };
    burstd::devfiles::enter(&burstd::devfiles::DeviceFiles::for_devices(&devices))
        .map_err(|e| e.to_string())?;
    let err = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(&command[0]).args(&command[1..]),
    );
    Err(format!("{}: {err}", command[0].to_string_lossy()))
}

fn run(a: Args) -> Result<(), String> {
    let path = socket(&a);
    // Every command but `run` talks to burstd.
    let connect = || Context::connect(&path).map_err(|e| e.to_string());
    match &a.what {
        What::Run { command } => run_with_device_files(&a, command)?,
        What::Dev => {
            let ctx = connect()?;
            let c = ctx.config();
            println!("device {}", c.name);
            println!("  address    {}", c.addr);
            println!("  gid        {}", std::net::Ipv6Addr::from(ctx.gid()));
            println!("  mtu        {}", c.mtu.bytes());
            if let Some(i) = &c.interface {
                println!("  interface  {i}");
            }
            println!("  threads    {}", c.threads);
            println!("  socket     {}", path.display());
            println!(
                "  port 1     ACTIVE (RoCE v2, UDP {})",
                burst_wire::ROCEV2_PORT
            );
        }
        What::Clients => {
            let ctx = connect()?;
            let me = ctx.client_id().unwrap_or(0);
            let Reply::Clients(list) = ask(&ctx, &Request::Clients)? else {
                return Err("unexpected reply".into());
            };
            for c in list.iter().filter(|c| c.id != me) {
                println!(
                    "client {} pid {} uid {} {} (requests refused: {})",
                    c.id, c.pid, c.uid, c.comm, c.refused
                );
                println!("  pd   {:?}", c.pds);
                for (k, len, zc) in &c.mrs {
                    let how = if *zc { "zero-copy" } else { "single-copy" };
                    println!("  mr   key {k:#010x} {len} bytes {how}");
                }
                println!("  cq   {:?}", c.cqs);
                for (q, s) in &c.qps {
                    println!("  qp   {q:#x} {s}");
                }
                if !c.srqs.is_empty() {
                    println!("  srq  {:?}", c.srqs);
                }
                // Usage against burstd's per-client limits.
                let used: Vec<String> = c
                    .usage
                    .iter()
                    .map(|(name, used, limit)| format!("{name} {used}/{limit}"))
                    .collect();
                if !used.is_empty() {
                    println!("  limits {}", used.join(", "));
                }
            }
        }
        What::Stat { qp } => {
            let ctx = connect()?;
            let req = match qp {
                Some(q) => {
                    let n = match q.strip_prefix("0x") {
                        Some(h) => u32::from_str_radix(h, 16),
                        None => q.parse(),
                    }
                    .map_err(|_| format!("{q} is not a QP number"))?;
                    Request::QpCounters { qpn: n }
                }
                None => Request::Counters,
            };
            let v = match ask(&ctx, &req)? {
                Reply::Counters(c) => serde_json::to_value(*c),
                Reply::QpCounters(c) => serde_json::to_value(*c),
                _ => return Err("unexpected reply".into()),
            }
            .map_err(|e| e.to_string())?;
            let mut text = String::new();
            counter_lines(&v, "", &mut text);
            // A reader that stops early (`| head`) is not an error.
            let _ = std::io::stdout().write_all(text.as_bytes());
        }
        What::Capture { write, count } => {
            let ctx = connect()?;
            let mut fds = [0; 2];
            // SAFETY: pipe2 into a live array of two.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            // SAFETY: two fresh descriptors we own.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            let req = Request::Capture { packets: *count };
            match ctx.daemon_request(&req, &[w.as_fd()]) {
                Ok((Reply::Done, _)) => {}
                Ok((Reply::Error { message, .. }, _)) => return Err(message),
                Ok(_) => return Err("unexpected reply".into()),
                Err(e) => return Err(e.to_string()),
            }
            drop(w);
            let mut out: Box<dyn Write> = if write.as_os_str() == "-" {
                Box::new(std::io::stdout())
            } else {
                Box::new(std::fs::File::create(write).map_err(|e| e.to_string())?)
            };
            let mut r = std::fs::File::from(r);
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = r.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}
