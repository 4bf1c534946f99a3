//! Congestion control algorithms (DCQCN) for RoCEv2, pure and event driven
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
