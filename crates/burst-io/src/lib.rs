//! Packet ports: UDP socket, AF_XDP, DPDK and an in-memory simulator port
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
