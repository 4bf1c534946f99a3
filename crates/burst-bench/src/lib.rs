//! perftest-compatible benchmarks for burst
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
