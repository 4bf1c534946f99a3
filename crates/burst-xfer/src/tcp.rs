//! The TCP session: the same batches over kernel TCP, as Mooncake's TCP
//! transport moves them: each segment a small header and its bytes on one
//! of several connections, placed by a reader thread on the receiving
//! side straight into its pool; one notification per connection a batch
//! used, after its share (TCP orders it after the data on that stream).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::landing::{Landings, Notify};
use crate::{check, BatchId, Landed, Op, Pool, Segment, Transfer, XferError};

const HEADER: usize = 24;
const DATA: u32 = 1;
const NOTIFY: u32 = 2;

#[derive(Default)]
struct Shared {
    landings: Landings,
    broken: Option<String>,
}

type Inbox = Arc<(Mutex<Shared>, Condvar)>;

/// A session to one peer over TCP connections (see the module
/// documentation). READ is not offered.
pub struct TcpSession {
    pool: Arc<Pool>,
    peer_len: u64,
    streams: Vec<TcpStream>,
    inbox: Inbox,
    readers: Vec<std::thread::JoinHandle<()>>,
    next_batch: u64,
    next_stream: usize,
    done: HashMap<u64, u64>,
}

impl std::fmt::Debug for TcpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSession")
            .field("connections", &self.streams.len())
            .finish_non_exhaustive()
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> XferError {
    move |e| XferError::Setup(format!("{what}: {e}"))
}

impl TcpSession {
    /// Opens `n` connections to `addr` (the peer [`TcpSession::accept`]s).
    pub fn dial(pool: Arc<Pool>, addr: SocketAddr, n: usize) -> Result<TcpSession, XferError> {
        let streams = (0..n.max(1))
            .map(|_| TcpStream::connect(addr))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("connecting"))?;
        TcpSession::over(pool, streams)
    }

    /// Takes `n` connections from `listener`.
    pub fn accept(
        pool: Arc<Pool>,
        listener: &TcpListener,
        n: usize,
    ) -> Result<TcpSession, XferError> {
        let streams = (0..n.max(1))
            .map(|_| listener.accept().map(|(s, _)| s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("accepting"))?;
        TcpSession::over(pool, streams)
    }

    /// A session over connected streams (both sides the same number):
    /// each side tells the other its pool's size on every stream.
    pub fn over(pool: Arc<Pool>, streams: Vec<TcpStream>) -> Result<TcpSession, XferError> {
        let mut peer_len = u64::MAX;
        for s in &streams {
            s.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
            (&*s)
                .write_all(&(pool.len() as u64).to_le_bytes())
                .map_err(io("hello"))?;
        }
        for s in &streams {
            let mut b = [0u8; 8];
            (&*s).read_exact(&mut b).map_err(io("hello"))?;
            peer_len = peer_len.min(u64::from_le_bytes(b));
        }
        let inbox: Inbox = Arc::default();
        let mut readers = Vec::with_capacity(streams.len());
        for s in &streams {
            let s = s.try_clone().map_err(io("cloning a stream"))?;
            let (pool, inbox) = (Arc::clone(&pool), Arc::clone(&inbox));
            readers.push(
                std::thread::Builder::new()
                    .name("burst-xfer-tcp".into())
                    .spawn(move || read_loop(&pool, s, &inbox))
                    .map_err(io("a reader thread"))?,
            );
        }
        Ok(TcpSession {
            pool,
            peer_len,
            streams,
            inbox,
            readers,
            next_batch: 1,
            next_stream: 0,
            done: HashMap::new(),
        })
    }

    fn broken(&self) -> Option<String> {
        self.inbox
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .broken
            .clone()
    }
}

/// Places what one stream carries until it ends.
fn read_loop(pool: &Pool, mut s: TcpStream, inbox: &Inbox) {
    let fail = |why: String| {
        let mut g = inbox.0.lock().unwrap_or_else(|e| e.into_inner());
        g.broken.get_or_insert(why);
        inbox.1.notify_all();
    };
    loop {
        let mut h = [0u8; HEADER];
        if let Err(e) = s.read_exact(&mut h) {
            return fail(format!("the peer's stream ended: {e}"));
        }
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let word = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        let batch = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
        match kind {
            DATA => {
                let Some(p) = pool.range(word, len as usize) else {
                    return fail(format!(
                        "batch {batch}: data at {word}+{len} outside the pool"
                    ));
                };
                // SAFETY: `p..p+len` is inside the pool (checked); a
                // transfer's bytes are not read before it lands (the
                // pool's contract), so nothing else touches them now.
                let dst = unsafe { std::slice::from_raw_parts_mut(p, len as usize) };
                if let Err(e) = s.read_exact(dst) {
                    return fail(format!("batch {batch}: the stream ended mid-segment: {e}"));
                }
            }
            NOTIFY => {
                let mut g = inbox.0.lock().unwrap_or_else(|e| e.into_inner());
                g.landings.share(Notify {
                    batch,
                    bytes: word,
                    shares: len.max(1),
                });
                inbox.1.notify_all();
            }
            _ => return fail(format!("unknown frame kind {kind}")),
        }
    }
}

fn header(kind: u32, len: u32, word: u64, batch: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&word.to_le_bytes());
    h[16..24].copy_from_slice(&batch.to_le_bytes());
    h
}

impl Transfer for TcpSession {
    fn submit(&mut self, op: Op, segments: &[Segment]) -> Result<BatchId, XferError> {
        if op == Op::Read {
            return Err(XferError::Unsupported("READ over TCP"));
        }
        if let Some(b) = self.broken() {
            return Err(XferError::Broken(b));
        }
        let bytes = check(segments, self.pool.len() as u64, self.peer_len)?;
        let id = self.next_batch;
        self.next_batch += 1;
        let n = self.streams.len();
        let first = self.next_stream;
        self.next_stream = (first + 1) % n;
        let mut share = vec![0u64; n];
        let fail = |segment, e: std::io::Error| XferError::Segment {
            batch: id,
            segment,
            status: e.to_string(),
        };
        for (i, sg) in segments.iter().enumerate() {
            let k = (first + i) % n;
            share[k] += u64::from(sg.len);
            let p = self
                .pool
                .range(sg.local, sg.len as usize)
                .ok_or(XferError::Unsupported("checked range"))?;
            // SAFETY: inside the pool (checked); the caller does not
            // change a batch's source bytes while it is submitted.
            let data = unsafe { std::slice::from_raw_parts(p, sg.len as usize) };
            let s = &mut self.streams[k];
            s.write_all(&header(DATA, sg.len, sg.remote, id))
                .and_then(|()| s.write_all(data))
                .map_err(|e| fail(Some(i), e))?;
        }
        let used = n.min(segments.len().max(1));
        for j in 0..used {
            let k = (first + j) % n;
            self.streams[k]
                .write_all(&header(NOTIFY, used as u32, share[k], id))
                .map_err(|e| fail(None, e))?;
        }
        self.done.insert(id, bytes);
        Ok(BatchId(id))
    }

    fn wait(&mut self, id: BatchId, _timeout: Duration) -> Result<u64, XferError> {
        // Handed to the kernel in submit: done on this side.
        self.done.remove(&id.0).ok_or(XferError::NoSuchBatch(id.0))
    }

    fn wait_landed(&mut self, timeout: Duration) -> Result<Landed, XferError> {
        let deadline = Instant::now() + timeout;
        let mut g = self.inbox.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(l) = g.landings.next() {
                return Ok(l);
            }
            if let Some(b) = &g.broken {
                return Err(XferError::Broken(b.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(XferError::Timeout(timeout));
            }
            g = self
                .inbox
                .1
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for TcpSession {
    fn drop(&mut self) {
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}
