#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod counters;
mod error;
pub mod memory;
mod qp;
mod recvq;
pub mod sim;
mod srq;
mod types;

pub use counters::Counters;
pub use error::VerbsError;
pub use memory::{walk_sges, AtomicOp, MemError, Memory, Placement, QpScope, RemoteAccess};
pub use qp::{Payload, Qp, QpEvent, Transmit, MAX_RD_ATOMIC};
pub use srq::Srq;
pub use types::*;
