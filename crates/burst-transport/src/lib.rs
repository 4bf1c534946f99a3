//! Sans-IO InfiniBand transport (RC, UC, UD) state machines for RoCEv2
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
