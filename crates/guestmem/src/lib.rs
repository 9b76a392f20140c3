//! Guest memory access (see crate description).
