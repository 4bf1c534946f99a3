//! The Verbs API composing burst's crates, with its data-plane engine
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
