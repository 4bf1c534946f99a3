//! Copy engine: the one place that moves payload bytes in bulk (CPU, Intel DSA, DMA)
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
