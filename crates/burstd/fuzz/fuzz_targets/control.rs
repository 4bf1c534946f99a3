//! burstd's control protocol under arbitrary messages: a live daemon (an
//! engine over the in-memory port) and one client that sends each input as
//! a sequence of messages (split at 0xff bytes), half of them behind a
//! valid header. Every message must get a reply (no panic, no hang), and
//! the client must still be served afterwards.
#![no_main]

use std::sync::{Arc, OnceLock};

use burst_verbs::engine::{Drive, Engine, EngineOptions};
use burst_verbs::ports::{SimFaults, SimNet};
use burst_verbs::protocol::{self as p, Reply, Request};
use burstd::{Client, Daemon};
use libfuzzer_sys::fuzz_target;

struct World {
    daemon: Arc<Daemon>,
    client: Arc<Client>,
    _engine: Engine,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let net = SimNet::new(1, SimFaults::default());
        let mut o = EngineOptions::new(burst_verbs::Mtu::Mtu1024);
        o.drive = Drive::Caller;
        o.shared_rings = true;
        let engine = Engine::with_port(net.port("198.18.0.1:4791".parse().unwrap()), o).unwrap();
        let daemon = Daemon::new(engine.context(), burst_verbs::ports::Tap::new());
        let client = daemon.local_client().unwrap();
        World {
            daemon,
            client,
            _engine: engine,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    for (i, part) in data.split(|b| *b == 0xff).enumerate() {
        let msg = if i % 2 == 0 {
            let mut m = p::encode(&Request::Counters)[..8].to_vec();
            m.extend_from_slice(part);
            m
        } else {
            part.to_vec()
        };
        let _ = w.daemon.handle_message(&w.client, &msg, Vec::new());
    }
    // Still served: a PD, or the limit on PDs (inputs create objects too).
    let (r, _) = w
        .daemon
        .handle_message(&w.client, &p::encode(&Request::AllocPd), Vec::new());
    match r {
        Reply::Pd { pd } => {
            let done = w.daemon.handle_message(
                &w.client,
                &p::encode(&Request::DeallocPd { pd }),
                Vec::new(),
            );
            assert!(matches!(done.0, Reply::Done), "{:?}", done.0);
        }
        Reply::Error { errno, .. } if errno == libc::ENOMEM => {}
        r => panic!("still served: {r:?}"),
    }
    let (r, _) = w
        .daemon
        .handle_message(&w.client, &p::encode(&Request::Counters), Vec::new());
    assert!(matches!(r, Reply::Counters(_)), "still served: {r:?}");
});
