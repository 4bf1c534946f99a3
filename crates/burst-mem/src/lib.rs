//! Protection domains, memory regions, keys and remote-access checks
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
