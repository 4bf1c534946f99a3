//! Waking a lane's engine thread: the wake words and the pipes of daemon clients.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use crate::shm::Segment;

/// How a daemon client wakes a sleeping engine lane: a word per lane that
/// the engine sets before it blocks (in memory every client maps), and a
/// pipe per client and lane whose read end the lane also waits on (one
/// epoll set per lane). A client signals only when the word says the lane
/// sleeps: no system call per post while the engine is busy. Each client
/// has pipes of its own, so one that floods or fills its pipe wakes the
/// lane more often, at worst, and never blocks another client's signal.
#[derive(Debug)]
pub(crate) struct Wake {
    pub(super) seg: Arc<Segment>,
    pub(super) side: WakeSide,
    /// The link notifications lane 0 also waits on (see
    /// [`Wake::watch_link`]).
    link: std::sync::OnceLock<Arc<burst_io::netdev::LinkEvents>>,
}

#[derive(Debug)]
pub(super) enum WakeSide {
    /// The engine's: per lane, the set it sleeps on and an eventfd of its
    /// own process (QP1's MADs queued by burstd); the clients' read ends by
    /// token (lane, owner, reader).
    Engine {
        sets: Vec<crate::eventfd::WaitSet>,
        local: Vec<crate::eventfd::EventFd>,
        readers: RwLock<HashMap<u64, WakeReader>>,
        next_token: std::sync::atomic::AtomicU64,
    },
    /// A client's: its write end per lane.
    Client {
        writers: Vec<crate::eventfd::EventFd>,
    },
}

#[derive(Debug)]
pub(super) struct WakeReader {
    pub(super) lane: usize,
    pub(super) owner: u32,
    pub(super) fd: Arc<crate::eventfd::EventFd>,
}

/// The token of a lane's own eventfd in its wait set.
pub(super) const LOCAL_WAKE: u64 = u64::MAX;

/// The token of the link notifications in lane 0's wait set.
const LINK_WAKE: u64 = u64::MAX - 1;

impl Wake {
    /// The engine's: one word (a cache line apart), one wait set and one
    /// eventfd of its own per lane.
    pub(super) fn new(lanes: usize, memfd: bool) -> std::io::Result<Wake> {
        let len = lanes * 64;
        let seg = if memfd {
            Segment::memfd("burst-wake", len)?
        } else {
            Segment::anonymous(len)?
        };
        let mut sets = Vec::new();
        let mut local = Vec::new();
        for _ in 0..lanes {
            let set = crate::eventfd::WaitSet::new()?;
            let fd = crate::eventfd::EventFd::new()?;
            set.add(std::os::fd::AsFd::as_fd(&fd), LOCAL_WAKE)?;
            sets.push(set);
            local.push(fd);
        }
        Ok(Wake {
            seg: Arc::new(seg),
            side: WakeSide::Engine {
                sets,
                local,
                readers: RwLock::default(),
                next_token: Default::default(),
            },
            link: Default::default(),
        })
    }

    /// A client's view of the daemon's words, with its write ends.
    pub(crate) fn attach(
        seg: Arc<Segment>,
        writers: Vec<crate::eventfd::EventFd>,
    ) -> std::io::Result<Wake> {
        if seg.len() < writers.len() * 64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "wake segment too short",
            ));
        }
        Ok(Wake {
            seg,
            side: WakeSide::Client { writers },
            link: Default::default(),
        })
    }

    /// Lane 0's engine also waits on the device's link notifications
    /// ([`crate::dataplane::Device::follow_link_events`]) and drains them
    /// when it wakes; once per engine.
    pub(super) fn watch_link(
        &self,
        events: Arc<burst_io::netdev::LinkEvents>,
    ) -> std::io::Result<()> {
        let WakeSide::Engine { sets, .. } = &self.side else {
            return Ok(());
        };
        let Some(set) = sets.first() else {
            return Ok(());
        };
        set.add(std::os::fd::AsFd::as_fd(&*events), LINK_WAKE)?;
        let _ = self.link.set(events);
        Ok(())
    }

    /// The segment clients map.
    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// New pipes for client `owner`, one per lane: their read ends join the
    /// lanes' wait sets, their write ends are returned (to send).
    pub(super) fn add_client(&self, owner: u32) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
        let WakeSide::Engine {
            sets,
            readers,
            next_token,
            ..
        } = &self.side
        else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let mut writers = Vec::new();
        let mut added = Vec::new();
        let r = (|| {
            for (lane, set) in sets.iter().enumerate() {
                let (r, w) = crate::eventfd::EventFd::pipe(true)?;
                let token = next_token.fetch_add(1, Ordering::Relaxed);
                set.add(std::os::fd::AsFd::as_fd(&r), token)?;
                added.push(token);
                readers.write().unwrap_or_else(|e| e.into_inner()).insert(
                    token,
                    WakeReader {
                        lane,
                        owner,
                        fd: Arc::new(r),
                    },
                );
                writers.push(w.into());
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok(writers),
            Err(e) => {
                self.remove_client(owner);
                Err(e)
            }
        }
    }

    /// Client `owner` is gone: its read ends leave the wait sets.
    pub(super) fn remove_client(&self, owner: u32) {
        let WakeSide::Engine { sets, readers, .. } = &self.side else {
            return;
        };
        let gone: Vec<WakeReader> = {
            let mut m = readers.write().unwrap_or_else(|e| e.into_inner());
            let tokens: Vec<u64> = m
                .iter()
                .filter(|(_, r)| r.owner == owner)
                .map(|(t, _)| *t)
                .collect();
            tokens.iter().filter_map(|t| m.remove(t)).collect()
        };
        for r in gone {
            if let Some(set) = sets.get(r.lane) {
                set.remove(std::os::fd::AsFd::as_fd(&*r.fd));
            }
        }
    }

    /// What lane `lane` sleeps on (with its port).
    pub(super) fn wait_fd(&self, lane: usize) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.side {
            WakeSide::Engine { sets, .. } => sets.get(lane).map(std::os::fd::AsFd::as_fd),
            WakeSide::Client { .. } => None,
        }
    }

    /// After a sleep: takes every pending wake-up of the lane (level
    /// signals; bounded per reader, so a client that keeps writing only
    /// makes the lane look again).
    pub(super) fn drain(&self, lane: usize, tokens: &mut Vec<u64>) {
        let WakeSide::Engine {
            sets,
            local,
            readers,
            ..
        } = &self.side
        else {
            return;
        };
        tokens.clear();
        sets[lane].ready(tokens);
        for t in tokens.iter() {
            if *t == LOCAL_WAKE {
                local[lane].drain_all();
                continue;
            }
            if *t == LINK_WAKE {
                // Marks the change for the device's next step, which the
                // engine takes now that it woke.
                if let Some(l) = self.link.get() {
                    l.drain();
                }
                continue;
            }
            let fd = readers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(t)
                .map(|r| Arc::clone(&r.fd));
            if let Some(fd) = fd {
                fd.drain_all();
            }
        }
    }

    pub(super) fn sleeping(&self, lane: usize) -> &std::sync::atomic::AtomicU32 {
        self.seg.word(lane * 64)
    }

    /// A daemon client polled an empty CQ: counted in lane `lane`'s word
    /// (at byte 8 of its cache line), so that the daemon's engine stays
    /// awake while the client polls (it cannot step the lane itself).
    pub(crate) fn client_polled(&self, lane: usize) {
        if (lane + 1) * 64 <= self.seg.len() {
            self.seg.word(lane * 64 + 8).fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lane `lane`'s count of clients' empty polls.
    pub(super) fn client_polls(&self, lane: usize) -> u32 {
        self.seg.word(lane * 64 + 8).load(Ordering::Relaxed)
    }

    /// Wakes the lane whether it sleeps or not (the engine stopping).
    pub(super) fn wake(&self, lane: usize) {
        if let WakeSide::Engine { local, .. } = &self.side {
            if let Some(fd) = local.get(lane) {
                fd.signal();
            }
        }
    }

    /// After a doorbell: wakes the lane if it sleeps.
    pub(super) fn nudge(&self, lane: usize) {
        // Pairs with the engine's fence between setting the word and its
        // last look at the doorbells: one of the two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        let fd = match &self.side {
            WakeSide::Engine { local, .. } => local.get(lane),
            WakeSide::Client { writers } => writers.get(lane),
        };
        if let Some(fd) = fd {
            if self.sleeping(lane).load(Ordering::Relaxed) != 0 {
                fd.signal();
            }
        }
    }
}
