//! Connection manager: IB CM MADs over QP1 and address resolution
//!
//! Not implemented yet: this crate is a placeholder in the workspace layout.
