//! # burst-transport: sans-IO InfiniBand transport for RoCEv2
//!
//! The RC, UC and UD transport of the InfiniBand spec as pure state machines.
//! A [`Qp`] never touches a socket, a thread, a clock or application memory:
//! its caller feeds it posted work requests ([`Qp::post_send`],
//! [`Qp::post_recv`]), received packets ([`Qp::handle_packet`], burst-wire
//! views) and the current time ([`Qp::handle_timeout`]); it hands back packets
//! to send ([`Qp::poll_transmit`]: headers plus a reference to where the
//! payload lives), work completions ([`Qp::poll_completion`]) and its next
//! deadline ([`Qp::poll_timeout`]). Memory is reached only through the
//! [`Memory`] trait the caller implements (burst-mem in the stack, a simple
//! map in the simulator).
//!
//! The [`sim`] module drives any number of QP pairs over a seeded lossy,
//! reordering, duplicating and corrupting network.

#![forbid(unsafe_code)]

mod counters;
mod error;
pub mod memory;
mod qp;
pub mod sim;
mod srq;
mod types;

pub use counters::Counters;
pub use error::VerbsError;
pub use memory::{walk_sges, AtomicOp, MemError, Memory, QpScope, RemoteAccess};
pub use qp::{Payload, Qp, QpEvent, Transmit, MAX_RD_ATOMIC};
pub use srq::Srq;
pub use types::*;
