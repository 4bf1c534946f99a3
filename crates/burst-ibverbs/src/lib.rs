//! C-ABI drop-in for rdma-core's libibverbs.so.1
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
