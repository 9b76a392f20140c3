//! Guest image builder (see crate description).
