//! Connecting to burstd: the hello exchange, the shared segments it
//! hands over, and the watcher that notices the daemon's death.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use super::{MrMode, Remote};
use crate::engine::{ClientLayout, Context, ControlPlane, Wake};
use crate::protocol::{self as p, Reply, Request};
use crate::shm::Segment;

impl Context {
    /// Connects to burstd at `path` (daemon mode): the device is the
    /// daemon's, rings and doorbells are memory shared with it.
    pub fn connect(path: &std::path::Path) -> std::io::Result<Context> {
        Context::connect_with(path, MrMode::from_env())
    }

    /// [`Context::connect`], registering memory as `mode` says (remapped
    /// onto shared memfds, or copied by the daemon).
    pub fn connect_with(path: &std::path::Path, mode: MrMode) -> std::io::Result<Context> {
        let sock = p::connect(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("burst: cannot reach burstd at {}: {e}", path.display()),
            )
        })?;
        p::send(
            sock.as_fd(),
            &p::encode(&Request::Hello {
                version: p::VERSION,
                layout: p::layout(),
            }),
            &[],
        )?;
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let (msg, fds) =
            p::recv(sock.as_fd())?.ok_or_else(|| bad("burstd closed the socket".into()))?;
        let reply = p::decode::<Reply>(&msg).map_err(|e| bad(format!("burstd: {e}")))?;
        let Reply::Hello {
            device,
            client,
            event_slots,
            bells_offset,
            bells_stride,
            bells_depth,
            segment_len,
            wake_len,
        } = reply
        else {
            return Err(match reply {
                Reply::Error { errno, message, .. } => std::io::Error::new(
                    std::io::Error::from_raw_os_error(errno).kind(),
                    format!("burstd refused this client: {message}"),
                ),
                _ => bad("burstd: unexpected reply to hello".into()),
            });
        };
        let lanes = device.lanes.max(1) as usize;
        let mut fds = fds.into_iter();
        let (Some(seg_fd), Some(wake_fd), Some(events_fd)) = (fds.next(), fds.next(), fds.next())
        else {
            return Err(bad("burstd: hello without its segments".into()));
        };
        let seg = Arc::new(Segment::from_fd(seg_fd, segment_len as usize)?);
        let wake_fds = fds
            .map(crate::eventfd::EventFd::pipe_writer)
            .collect::<std::io::Result<Vec<_>>>()?;
        if wake_fds.len() != lanes {
            return Err(bad("burstd: one wake pipe per lane expected".into()));
        }
        let wake = Wake::attach(
            Arc::new(Segment::from_fd(wake_fd, wake_len as usize)?),
            wake_fds,
        )?;
        let layout = ClientLayout {
            event_slots,
            bells_offset,
            bells_stride,
            bells_depth,
            len: segment_len,
        };
        let remote = Arc::new(Remote::new(sock, client, mode));
        let plane = Arc::clone(&remote) as Arc<dyn ControlPlane>;
        let ctx = Context::attached(device, layout, seg, wake, events_fd, plane)?;
        tracing::info!(
            client,
            socket = %path.display(),
            "burst: daemon mode (burstd serves device {})",
            ctx.config().name
        );
        watch_daemon(Arc::downgrade(&remote), ctx.fatal_notice());
        Ok(ctx)
    }
}

/// Watches a client's control socket: when burstd dies the socket hangs
/// up, and every QP's application learns it at once (`DeviceFatal` on the
/// async fd, every verb failing) instead of hanging.
fn watch_daemon(remote: std::sync::Weak<Remote>, fatal: impl Fn() + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("burst-watch".into())
        .spawn(move || loop {
            let Some(r) = remote.upgrade() else {
                return;
            };
            let mut p = libc::pollfd {
                fd: r.socket().as_raw_fd(),
                events: 0,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 100) };
            if n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                tracing::error!("burst: burstd is gone: every verb fails from now on");
                r.set_dead();
                fatal();
                return;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("burst: no thread to watch burstd: {e}");
    }
}
